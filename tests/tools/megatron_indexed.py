#!/usr/bin/env python3
"""megatron-core's own indexed data sets and GPT samples, for
tests/unit/test_indexed_dataset.cpp to compare ptrain's reader against.

Usage: megatron_indexed.py OUTDIR

Writes into OUTDIR, all with megatron-core itself:
  a.idx/.bin        uint16, one sequence per document (preprocess_data's default)
  b.idx/.bin        int32, documents of 1 to 3 sequences, ids past uint16's range
  dtype_NAME.idx/.bin  a few small documents in every dtype megatron writes
  megatron.json     what megatron-core makes of them: the files' index arrays,
                    the split ranges, GPTDataset and BlendedDataset samples
                    (through BlendedMegatronDatasetBuilder, as pretrain_gpt.py
                    builds them) with their document, sample and shuffle
                    indices, numpy RandomState shuffles, numpy sums, and
                    helpers.build_blending_indices on random weights.

Exit status 77 when megatron-core (or its compiled helpers) cannot be
imported: the C++ test skips then. The compiled helpers ship in
megatron-core's wheel (megatron/core/datasets/helpers_cpp*.so), so no
compiler is needed and the comparison is against megatron's C++ itself.
"""
import json
import os
import sys
from collections import OrderedDict

try:
    import numpy
    import megatron.core
    from megatron.core.datasets import helpers
    from megatron.core.datasets.blended_dataset import BlendedDataset
    from megatron.core.datasets.blended_megatron_dataset_builder import (
        BlendedMegatronDatasetBuilder,
        _get_size_per_split_per_dataset,
    )
    from megatron.core.datasets.blended_megatron_dataset_config import (
        convert_split_vector_to_split_matrix,
        parse_and_normalize_split,
    )
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
    from megatron.core.datasets.indexed_dataset import IndexedDataset, IndexedDatasetBuilder
except Exception as error:  # ImportError, or the helpers' shared object failing to load
    print(f"megatron-core cannot be imported: {error!r}", file=sys.stderr)
    sys.exit(77)


class Tokenizer:
    """What GPTDatasetConfig and MegatronDataset ask of a tokenizer: a vocab
    size, an end-of-document id and identifiers for the cache key. No pad
    attribute, so megatron pads with its _PAD_TOKEN_ID, -1."""

    def __init__(self, vocab_size):
        self.vocab_size = vocab_size
        self.eod = 0
        self.unique_identifiers = OrderedDict([("class", "Tokenizer"), ("vocab_size", vocab_size)])


def write_set(prefix, dtype, vocab, documents, rng, max_sequences_per_document=1, max_length=160):
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=dtype)
    for _ in range(documents):
        count = int(rng.integers(1, max_sequences_per_document + 1))
        lengths = [int(n) for n in rng.integers(1, max_length, size=count)]
        tokens = rng.integers(0, vocab, size=sum(lengths))
        builder.add_document(numpy.array(tokens, dtype=dtype), lengths)
    builder.finalize(prefix + ".idx")


def index_arrays(prefix):
    data = IndexedDataset(prefix)
    return {
        "dtype": numpy.dtype(data.index.dtype).name,
        "sequence_lengths": data.sequence_lengths.tolist(),
        "sequence_pointers": data.index.sequence_pointers.tolist(),
        "document_indices": data.document_indices.tolist(),
        "sequences": [data[i].astype(numpy.int64).tolist() for i in range(min(len(data), 40))],
    }


def gpt_dump(ds):
    num_epochs = ds._get_num_epochs(ds._get_num_tokens_per_epoch())
    return {
        "prefix": ds.dataset_path,
        "split": ds.index_split.name,
        "begin": int(ds.indices[0]) if len(ds.indices) else 0,
        "end": int(ds.indices[-1]) + 1 if len(ds.indices) else 0,
        "num_samples": ds.num_samples,
        "size": len(ds),
        "epochs": int(num_epochs),
        "tokens_per_epoch": int(ds._get_num_tokens_per_epoch()),
        "document_index": numpy.asarray(ds.document_index).tolist(),
        "sample_index": numpy.asarray(ds.sample_index).reshape(-1).tolist(),
        "shuffle_index": numpy.asarray(ds.shuffle_index).tolist(),
        "samples": [ds._query_document_sample_shuffle_indices(i)[0].tolist() for i in range(len(ds))],
    }


def dump(ds):
    if ds is None:
        return None
    if isinstance(ds, BlendedDataset):
        return {
            "kind": "blended",
            "size": len(ds),
            "weights": [float(w) for w in ds.weights],
            "dataset_index": ds.dataset_index.tolist(),
            "dataset_sample_index": ds.dataset_sample_index.tolist(),
            "datasets": [gpt_dump(d) for d in ds.datasets],
        }
    return dict(kind="gpt", **gpt_dump(ds))


def build(out, name, prefixes, weights, split, sizes, seed, seq, **extra):
    config = GPTDatasetConfig(
        random_seed=seed,
        sequence_length=seq,
        blend=(prefixes, weights),
        split=split,
        # No cache folder: BlendedDataset would then call torch.distributed
        # (uninitialised here); GPTDataset caches beside the files instead.
        path_to_cache=None,
        tokenizer=Tokenizer(100000),
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
        **extra,
    )
    splits = BlendedMegatronDatasetBuilder(GPTDataset, sizes, lambda: True, config).build()
    return {
        "name": name,
        "prefixes": [os.path.basename(p) for p in prefixes],
        "weights": weights,
        "split": split,
        "sizes": sizes,
        "seed": seed,
        "sequence_length": seq,
        "add_extra_token_to_sequence": extra.get("add_extra_token_to_sequence", True),
        "drop_last_partial_validation_sequence": extra.get("drop_last_partial_validation_sequence", True),
        "mid_level_dataset_surplus": config.mid_level_dataset_surplus,
        "splits": [dump(s) for s in splits],
    }


def train_tokens(prefix, split):
    """Tokens of the train split of a file, to size a request in epochs."""
    data = IndexedDataset(prefix)
    matrix = convert_split_vector_to_split_matrix(parse_and_normalize_split(split))
    count = data.sequence_lengths.shape[0]
    # The builder's own rounding (_build_megatron_dataset_splits).
    begin = int(round(matrix[0][0] * float(count)))
    end = int(round(matrix[0][1] * float(count)))
    return int(data.sequence_lengths[begin:end].sum())


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    rng = numpy.random.default_rng(20240611)
    a, b = os.path.join(out, "a"), os.path.join(out, "b")
    write_set(a, numpy.uint16, 65535, 300, rng)
    write_set(b, numpy.int32, 100000, 260, rng, max_sequences_per_document=3)
    dtypes = ["uint8", "int8", "int16", "int32", "int64", "float64", "float32", "uint16"]
    for name in dtypes:
        limit = 100 if name == "int8" else 200
        write_set(os.path.join(out, "dtype_" + name), getattr(numpy, name), limit, 12, rng, 2, 20)

    result = {"megatron_core_version": megatron.core.__version__, "numpy_version": numpy.__version__}
    result["files"] = {n: index_arrays(os.path.join(out, n)) for n in ["a", "b"] + ["dtype_" + d for d in dtypes]}

    # Split ranges: megatron's own matrix, the builder's rounding.
    split_strings = ["969,30,1", "80,15,5", "90,10,0", "1,1,1", "100", "99/1", "0.3,0.3,0.4", "2,1", "1,0,1",
                     "33.3,33.3,33.4", "98,1.5,.5"]
    counts = [0, 1, 2, 3, 7, 10, 100, 299, 300, 1001, 123457]
    ranges = []
    for split in split_strings:
        matrix = convert_split_vector_to_split_matrix(parse_and_normalize_split(split))
        for count in counts:
            row = []
            for bookends in matrix:
                row.append(None if bookends is None else
                           [int(round(bookends[0] * float(count))), int(round(bookends[1] * float(count)))])
            ranges.append({"split": split, "count": count, "ranges": row})
    result["split_ranges"] = ranges

    # numpy's legacy RandomState(seed).shuffle, which orders megatron's epochs.
    shuffles = []
    for seed, n in [(0, 1), (1, 2), (5, 3), (1234, 1000), (2**32 - 1, 777), (42, 70000)]:
        values = numpy.arange(n, dtype=numpy.int32)
        numpy.random.RandomState(seed).shuffle(values)
        shuffles.append({"seed": seed, "n": n, "order": values.tolist()})
    result["shuffles"] = shuffles

    sums = []
    for n in [1, 3, 7, 8, 9, 16, 127, 128, 129, 300, 1000]:
        values = rng.random(n) * 10.0 ** rng.integers(-3, 4, size=n)
        sums.append({"values": values.tolist(), "sum": float(numpy.sum(values))})
    result["sums"] = sums

    blend_sizes = []
    for weights, target in [([0.3, 0.7], 600), ([1 / 3, 1 / 3, 1 / 3], 1001), ([0.05, 0.9, 0.05], 7)]:
        for surplus in [0.0, 0.005, 0.1]:
            per = _get_size_per_split_per_dataset(weights, [target], surplus=surplus)
            blend_sizes.append({"weights": weights, "target": target, "surplus": surplus,
                                "sizes": [p[0] for p in per]})
    result["blend_sizes"] = blend_sizes

    blending = []
    for datasets, size in [(2, 50), (5, 1000), (7, 333)]:
        weights = rng.random(datasets)
        weights = weights / numpy.sum(weights)
        dataset_index = numpy.zeros(size, dtype=numpy.int16)
        dataset_sample_index = numpy.zeros(size, dtype=numpy.int64)
        helpers.build_blending_indices(dataset_index, dataset_sample_index, weights, datasets, size, False)
        blending.append({"weights": weights.tolist(), "size": size, "dataset_index": dataset_index.tolist(),
                         "dataset_sample_index": dataset_sample_index.tolist()})
    result["blending"] = blending

    # The GPT data sets, through megatron's builder.
    cases = []
    # Train asks for several epochs with a short final one (separated), valid
    # keeps its last partial sample (padded with -1), test is one epoch.
    cases.append(build(out, "single_a", [a], None, "80,15,5", [1000, 30, None], 1234, 64,
                       drop_last_partial_validation_sequence=False))
    # Train asks for 2.9 epochs: the final epoch is long enough to be shuffled
    # with the others.
    per_epoch = (train_tokens(b, "969,30,1") - 1) // 48
    cases.append(build(out, "single_b", [b], None, "969,30,1", [2 * per_epoch + (9 * per_epoch) // 10, None, 3],
                       7, 48))
    # No extra token, no test split.
    cases.append(build(out, "single_a_no_extra", [a], None, "90,10,0", [200, 20, None], 3, 50,
                       add_extra_token_to_sequence=False))
    # Weighted blend of both files.
    cases.append(build(out, "blend", [a, b], [0.3, 0.7], "80,15,5", [600, 40, 20], 99, 32))
    # Blend by length: train capped at the total, valid exhaustive.
    cases.append(build(out, "blend_by_length", [a, b], None, "80,15,5", [500, None, 15], 5, 40))
    result["cases"] = cases

    with open(os.path.join(out, "megatron.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
