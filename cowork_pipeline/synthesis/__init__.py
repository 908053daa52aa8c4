"""Capability-guided synthesis: draft environments, certify them, repair what fails."""
