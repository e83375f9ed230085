"""comlrl 1.4.3's module path of the centralized adapters (``import
comlrl.trainers.preference.centralized``); they live in
:mod:`comlrl.trainers.reinforce.centralized`, shared by centralized MAGRPO, MADPO and MARLHF."""

from comlrl.trainers.reinforce.centralized import (
    CentralizedComparatorAdapter,
    CentralizedComparatorParseError,
    TaggedCentralizedComparatorAdapter,
)

__all__ = ["CentralizedComparatorAdapter", "CentralizedComparatorParseError", "TaggedCentralizedComparatorAdapter"]
