"""kneeswarm: find where an inference service stops scaling, and say why.

One installed package; its folders are the floors of docs/design.md:

* ``kneeswarm.contracts``  the plan, the run directory, outcomes (floor 1)
* ``kneeswarm.collectors`` what is measured on a host (floor 2)
* ``kneeswarm.agents``, ``kneeswarm.analysis``, ``kneeswarm.locustfiles`` (floor 3)
* ``kneeswarm.launch``     the command line and one run's processes (floors 4 and 5)
* ``kneeswarm.target``     the demo inference server, apart

``agents``, ``analysis``, ``collectors`` and ``locustfiles`` are folders at the repository's top
level, linked into this package (docs/design.md, "One installed name").
"""
