#!/usr/bin/env python3
"""Regenerate a shipped knowledge table: ``instinct_fleet/model/knowledge/vllm-<version>.json``.

Usage, from the repository root (pip fetches the wheel from the package registry):

    python scripts/extract_vllm_knowledge.py 0.33.0
    python scripts/extract_vllm_knowledge.py path/to/vllm-0.33.0-...whl

The extractor itself is ``instinct_fleet/model/extract.py``, the one ``instinct-fleet vllm-facts``
runs for a version that is not shipped; a table shipped here is a tested one (tests/unit/test_knowledge.py).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from instinct_fleet.model.extract import download, extract

OUT_DIR = Path(__file__).resolve().parent.parent / "instinct_fleet" / "model" / "knowledge"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("release", help="a vLLM version (pip downloads its wheel) or a wheel path")
    parser.add_argument("--out", type=Path, default=OUT_DIR)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        wheel = Path(args.release)
        data = extract(wheel if wheel.is_file() else download(args.release, Path(tmp)))
    out = args.out / f"vllm-{data['version']}.json"
    out.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n")
    print(f"wrote {out}: {len(data['env_vars'])} env vars, {len(data['flags'])} flags")  # type: ignore[arg-type]
    return 0


if __name__ == "__main__":
    sys.exit(main())
