"""State motion: manifest, shadow slot, transports and the engine-side endpoint of the six verbs."""
