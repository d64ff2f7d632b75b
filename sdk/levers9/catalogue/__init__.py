"""`levers9 catalogue build`, the offline side: corpus, import analysis, grouping, the staged pipeline.

corpus.py fetches real example code; analysis.py finds what it imports; grouping.py (pure) chooses at
most K package sets to capture; pipeline.py runs the stages, resumably, with the platform-dependent
stages (measurement, capture) passed in as hooks.
"""
