"""The contracts every part of kneeswarm talks through: the plan, the run directory (its file names
and the shapes of its files, spelled once) and how a run ended (meta.json ``ended``, the exit codes
of every command).  The lowest floor above the remote agent: it imports nothing of the project but
the agent's defaults."""
