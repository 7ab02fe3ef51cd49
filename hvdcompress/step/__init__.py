"""The step: the driver that runs everything a step does around the engine whatever the framework
(names and order, predivide, take-overs, clip order, loss-scale overflow, rank agreement, replica
check, bytes, rebuild after a world change), the options it is built from and their checks, the
front-end contract whose sequence every front end fills (:mod:`hvdcompress.step.frontend`), and
DiLoCo's outer sync every H steps (:mod:`hvdcompress.step.diloco`).

Owns: the step's sequence. May import every core package below it (ops, contract, compressors,
transport, state, adam, engines, registry); never a front end or a planner.
"""
