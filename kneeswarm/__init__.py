"""kneeswarm: the entry points (cli, conductor: floor 4) and the contracts every part talks
through (plan, rundir: floor 1); target/ is the demo inference server, which stands apart."""
