"""Offline experience: datasets in Minari's format, read and written."""
