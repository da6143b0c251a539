"""Every rendering in one layer: rich tables at 80 columns, JSON shaping, advice, plots.

Commands parse options, call the library and hand the result to their reporter here.
"""
