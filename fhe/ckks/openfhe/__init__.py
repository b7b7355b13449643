"""The OpenFHE CKKS engine: server-side bootstrapping, run in a Python 3.10 worker process.

``worker.py`` runs in OpenFHE's interpreter and imports only openfhe and numpy; ``engine.py`` drives
it and evaluates the program on its ciphertexts; ``backend.py`` plans the bootstraps, makes the keys
and writes the artifacts. Nothing here imports openfhe into the toolkit's own interpreter.
"""
