"""kneeswarm: the command line (cli), one run's processes (conductor, lifecycle) and the contracts
every part talks through (plan, rundir, outcome); target/ is the demo inference server, which
stands apart (docs/design.md, "Floors")."""
