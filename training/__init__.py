"""Training the embedded models (never imported by the library): ``python -m training.train``."""
