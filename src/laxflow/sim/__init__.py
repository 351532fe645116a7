"""Simulation: the flow-level network engine and the serving simulator."""
