"""Several runs at once: a comparison of two, the history of many, a sweep of shapes."""
