"""From the run directory to each step's figures: the rows' statistics, the servers' samples over
each step's window, and whether each figure can be trusted (the lowest floor of the analysis)."""
