"""CuTe DSL kernels for sm_90a (one module per kernel family). Importing this package never
imports cutlass eagerly; each module reports through can_implement() why it cannot run."""
