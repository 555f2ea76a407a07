"""Repository agents that hook into model load and unload."""
