"""What runs inside the Locust processes (floor 3, but for the locustfile swarm.py and its wiring
into Locust plugin.py, on the top floor): the step shape, the users and their protocols, the per-request recorder, worker clocks."""
