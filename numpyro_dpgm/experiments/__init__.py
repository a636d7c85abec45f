"""Runnable studies: the demo on the bundled Adult data and reproductions of the papers."""
