"""snlite's version, written in one place: ``snlite.__version__`` and the report's header read it
here (a module that imports nothing, so any module can import it without a cycle)."""
__version__ = "0.1.0"
