"""Analysis of stored run records: tables, paper figures, ``testbed report``.

Reads results folders only and imports no training or network code, so
every table and figure can be redrawn from a copied results folder.
"""
