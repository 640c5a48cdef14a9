"""The data phase: training examples, truncation, prepared datasets, streaming."""
