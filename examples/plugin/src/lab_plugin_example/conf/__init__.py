"""The plug-in's config groups (Hydra reads them as package resources)."""
