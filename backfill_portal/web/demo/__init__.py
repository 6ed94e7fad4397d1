"""The demo: its catalog (catalog.yaml) and synthetic source data (sources.py), loaded by `load_demo`."""
