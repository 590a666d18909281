"""Extraction: cost models (`<unit>_cost.py`) and extractors (greedy DAG, exact ILP)."""
