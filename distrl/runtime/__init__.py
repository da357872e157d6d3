"""Processes around the roles. The only package that imports ray (lazily, in cluster/actors)."""
