"""Family-agnostic, validated specs that both kernels/ and reference/ consume (one name space).

A spec is plain data: the architecture numbers plus a mapping from canonical tensor names to CPU torch tensors in
their stored dtype. Readers in ``bloomery_cli`` build them; neither kernels/ nor reference/ ever sees a file.

``core``: what every family shares (layer shape, target, block drafts, MTP, EAGLE-3); ``shapes``: shapes several
families reuse; ``families/<family>.py``: a family's own (docs/ARCHITECTURE.md, "Adding a family", place 2). Every
name is re-exported here, so ``from bloomery_gates.spec import X`` reads the same whichever file holds X.
"""

from .core import DFlash2Spec, DFlashSpec, DSparkSpec, Eagle3Spec, LayerShape, ModelSpec, MTPSpec, RopeScaling, Tensors
from .families.deepseek4 import Deepseek4DSparkSpec, Deepseek4MTPSpec, Deepseek4Spec, V4AttnShape
from .families.deepseek41 import CandidateMask, Deepseek41DSparkSpec, Deepseek41Spec, V41Stream
from .families.glm5next import Glm5NextSpec
from .families.mimo2 import Mimo2MTPSpec, Mimo2Spec, MimoShape
from .families.qwen4exp import PLEShape, QSAShape, Qwen4ExpMTPSpec, Qwen4ExpSpec
from .families.qwen35moe import Qwen35MoeSpec
from .families.qwen38 import Qwen38Spec
from .shapes import AttnShape, DSAShape, HCShape, HybridShape, KDAShape, MLAShape, MoEShape

__all__ = ["AttnShape", "CandidateMask", "DFlash2Spec", "DFlashSpec", "DSAShape", "DSparkSpec",
           "Deepseek41DSparkSpec", "Deepseek41Spec", "Deepseek4DSparkSpec", "Deepseek4MTPSpec", "Deepseek4Spec",
           "Eagle3Spec", "Glm5NextSpec", "HCShape", "HybridShape", "KDAShape", "LayerShape", "MLAShape", "MTPSpec",
           "Mimo2MTPSpec", "Mimo2Spec", "MimoShape", "MoEShape", "ModelSpec", "PLEShape", "QSAShape",
           "Qwen35MoeSpec", "Qwen38Spec", "Qwen4ExpMTPSpec", "Qwen4ExpSpec", "RopeScaling", "Tensors", "V41Stream",
           "V4AttnShape"]
