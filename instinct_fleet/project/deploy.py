"""instinct-fleet: bare AMD Instinct hosts to tuned hosts serving vLLM.

    pyinfra inventories/prod.py deploy.py      (or: instinct-fleet deploy inventories/prod.py)

Run it from this directory: pyinfra reads config.py and group_data/ from the directory it is
started in. The stages are @deploy functions of the installed package (instinct_fleet.deploys);
call single stages instead of fleet(), or add operations of your own around them.
"""

from instinct_fleet.deploys import fleet

fleet()
