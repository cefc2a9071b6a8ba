"""summary.json assembled: the steps' figures, the knees, the findings, the gates, and what a search
or a soak adds."""
