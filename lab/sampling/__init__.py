from lab.sampling.metadata import SamplingMetadata, make_generator
from lab.sampling.params import SamplingParams
from lab.sampling.sampler import Sampler

__all__ = ["Sampler", "SamplingMetadata", "SamplingParams", "make_generator"]
