"""The bundled demo inference server: real protocols, real compute, known knees and faults.

It imports nothing of kneeswarm and is used exactly as a real server would be."""
