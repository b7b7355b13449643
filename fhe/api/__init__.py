"""The library behind every ``fhe`` command: one call per command, the same from a notebook.

    from fhe import api
    outcome = api.train_model(api.TrainRequest(task="digits", recipe="tfhe"))
    outcome.save("model.pt")
    c = api.compile_file("model.pt", api.CompileOptions(scheme="tfhe"))
    api.check_circuit(c); api.keygen(c); print(api.one_encrypted_sample(c).describe())
    print(api.compare_file("model.pt", api.CompileOptions(), n=360)["accuracy"])
    print(api.run_artifact("artifacts/", sample=0).describe())

Each call takes typed options and returns a result; the scheme (TFHE or CKKS) is dispatched here,
once per call. Errors: :class:`~fhe.errors.BadOptionError` when the options or files given cannot
work (the CLI exits 2), any other :class:`~fhe.errors.FheError` when the work itself fails (exit 1).
Printing is the caller's: messages arrive through ``on_message``, progress through callbacks.
"""

from fhe.api.artifacts import (
    ArtifactRun,
    BatchOutcome,
    batch_artifact,
    client_input,
    load_task_of_artifact,
    named,
    pick_test_sample,
    read_input,
    run_artifact,
)
from fhe.api.compilation import SchemeSteps, steps_for
from fhe.api.compile import (
    CircuitMismatchError,
    Compilation,
    CompileOptions,
    LayoutChoice,
    NoParametersError,
    SampleCheck,
    check_circuit,
    choose_layout,
    compare_file,
    compile_file,
    keygen,
    one_encrypted_sample,
    save_artifacts,
)
from fhe.api.quantize import QuantizeOptions, quantize_file
from fhe.api.recipes import Recipe, recipe_for
from fhe.api.train import (
    EncryptionInputs,
    TrainOutcome,
    TrainRequest,
    load_for_encryption,
    load_model_and_task,
    train_model,
    with_recipe,
)

__all__ = [
    "ArtifactRun",
    "BatchOutcome",
    "CircuitMismatchError",
    "Compilation",
    "CompileOptions",
    "EncryptionInputs",
    "LayoutChoice",
    "NoParametersError",
    "QuantizeOptions",
    "Recipe",
    "SampleCheck",
    "SchemeSteps",
    "TrainOutcome",
    "TrainRequest",
    "batch_artifact",
    "check_circuit",
    "choose_layout",
    "client_input",
    "named",
    "compare_file",
    "compile_file",
    "keygen",
    "load_for_encryption",
    "load_model_and_task",
    "load_task_of_artifact",
    "one_encrypted_sample",
    "quantize_file",
    "read_input",
    "run_artifact",
    "save_artifacts",
    "steps_for",
    "pick_test_sample",
    "recipe_for",
    "train_model",
    "with_recipe",
]
