"""What a vLLM release's own source says, read with ``ast`` and never imported: one module per part of the table that
:func:`instinct_fleet.model.extract.extract` writes."""
