"""ms-swift plugin: registers gpumon's step callback in the installed ms-swift.

    swift sft ... --external_plugins "$(python -m gpumon.integrations.swift --plugin-path)" \\
        --callbacks gpumon

ms-swift 4.x: ``callbacks_map["gpumon"]`` (selected by ``--callbacks gpumon``); 3.x: appended to
``extra_callbacks``. Settings: GPUMON_SWIFT_BACKEND, GPUMON_SWIFT_EVERY_N_STEPS,
GPUMON_SWIFT_PER_GPU (see gpumon.integrations.swift). Loaded by path, not as part of the package.
"""

import logging

from gpumon.integrations.swift import register

logging.getLogger("gpumon").info("%s", register())
