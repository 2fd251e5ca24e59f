"""Looking at a run: the memory estimate, the measured timeline, and pictures."""
