"""TFHE through concrete-python: the backend (``backend.py``), the recipe and pre-flight
(``recipe.py``), the encrypted-vs-clear comparison (``compare.py``) and the search for the first
diverging node (``divergence.py``). Importing this package imports no FHE library; its modules
import concrete-python only."""
