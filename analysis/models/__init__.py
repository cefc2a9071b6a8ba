"""The models the analysis fits to the steps' figures: the knee, the Universal Scalability Law, the
capacity plan against an SLA, and the trend test over a series of runs (pure numbers in, numbers out)."""
