"""The entry points and one run's processes: the command line, the conductor that starts the target
check, the Locust master and workers and the test's lifecycle (host agents, scrapes, the report),
live progress and export, and the search's decision of the next probe."""
