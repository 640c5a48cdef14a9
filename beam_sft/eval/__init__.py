"""Generation on held-out turns, parsing, and format metrics."""
