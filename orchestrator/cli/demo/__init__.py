"""`warren demo`: a bundled sample repository and a scripted session that works on it."""
