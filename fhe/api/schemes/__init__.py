"""What differs between TFHE and CKKS in a compile-and-run session, one module per scheme
(``tfhe.py``, ``ckks.py``), each registering its :class:`~fhe.api.compilation.SchemeSteps` next to
its definition. Importing this package imports them all."""

from models.registry import import_modules

import_modules(__name__, __path__)
