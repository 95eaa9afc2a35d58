"""Experiments end to end: spec -> fresh network per trial -> processes -> records -> report."""
