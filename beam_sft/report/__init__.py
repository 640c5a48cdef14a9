"""What a person reads: mask views, HTML pages, dataset statistics."""
