//! gpumon-mock
