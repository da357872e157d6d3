"""Networks from one factory: torsos by observation space and the `model` section, recurrent cores,
stacked copies, and weights between processes. The algorithms put their heads on top."""
from distrl.models.cores import RecurrentCore
from distrl.models.ensemble import StackedLinear, make_ensemble
from distrl.models.factory import TorsoError, check_torso, make_torso
from distrl.models.torsos import mlp
from distrl.models.weights import Weights, as_input, laid_out_as, load_numpy_weights, numpy_out, to_numpy_weights

__all__ = ["RecurrentCore", "StackedLinear", "TorsoError", "Weights", "as_input", "check_torso", "laid_out_as",
           "load_numpy_weights", "make_ensemble", "make_torso", "mlp", "numpy_out", "to_numpy_weights"]
