"""The kneeswarm locustfile: `locust -f locustfiles/swarm.py --kneeswarm-plan plan.toml`.

Works headless (the conductor, `kneeswarm run`), in the web UI (press Start: each start is
a new run directory under --kneeswarm-out), distributed (--master / --worker) and local.
"""

from kneeswarm.locustfiles import plugin  # noqa: F401  (registers the event listeners)
from kneeswarm.locustfiles.shape import StepShape as KneeswarmSteps  # noqa: F401
from kneeswarm.locustfiles.users import InferenceUser  # noqa: F401
