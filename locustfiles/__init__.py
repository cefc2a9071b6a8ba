"""What runs inside the Locust processes (floor 3): the listeners that wire kneeswarm into Locust
(plugin), the step shape, the users and their protocols, the per-request recorder, worker clocks."""
