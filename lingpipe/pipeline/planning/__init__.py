"""Planning: cutting the cells into stages, their costs, the stages table, and
the search for a plan."""
