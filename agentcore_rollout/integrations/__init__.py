"""Adapters to trainers; each behind its own extra (`[verl]`)."""
