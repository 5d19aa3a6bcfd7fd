"""Every ``--help`` text of the command line, rendered in advance (written by ``python -m
tensorslim.cli.help_cache``; do not edit by hand).

A help text is its sections (the blocks between blank lines); a section that several commands print (the method
options of ``train`` and ``convert``) is written once, as a constant, and named in each of them.
"""

# ruff: noqa: E501

METHOD_OPTIONS = """method options (each applies to the methods named):
  --rank INT                    LoRA rank (default: 8) [lora, prefix, adapter, prompt, unipelt,
                                unipelt-prompt, peft-lora, peft-prompt]; latent rank (default: the
                                model's recipe, else a quarter of min(d_in, d_out)) [cola, svd,
                                cola-m, lax-cola, lax-svd]; TT max rank (default: CoMERA's 30) [tt,
                                lax-tt, comera]; starting latent rank (default: the model's CoLA
                                recipe, else d/4) [cola-adaptive]; projection rank (default: the
                                model's CoLA rank, else 128) [galore]; Kronecker terms per layer
                                (default: 1) [kron]; max TT rank of the encoder's linear layers
                                (default: 16) [tt-qat]
  --lora-alpha FLOAT            LoRA scale numerator, the update is (alpha/rank)·B·A·x when ungated
                                (default: 16.0) [lora, prefix, adapter, prompt, unipelt, unipelt-
                                prompt, peft-lora, peft-prompt]
  --prefix-length INT           prefix vectors per layer (default: 10) [lora, prefix, adapter,
                                prompt, unipelt, unipelt-prompt, peft-lora, peft-prompt]
  --prefix-mlp INT              width of the prefix reparametrization MLP (0: train the prefixes
                                directly) (default: 512) [lora, prefix, adapter, prompt, unipelt,
                                unipelt-prompt, peft-lora, peft-prompt]
  --reduction INT               bottleneck adapter: hidden size / bottleneck size (default: 16)
                                [lora, prefix, adapter, prompt, unipelt, unipelt-prompt, peft-lora,
                                peft-prompt]
  --prompt-length INT           soft prompt tokens (default: 10) [lora, prefix, adapter, prompt,
                                unipelt, unipelt-prompt, peft-lora, peft-prompt]
  --prompt-init-text STR        initialize the prompt from this text's word embeddings (e.g. the
                                class names; default: random) [lora, prefix, adapter, prompt,
                                unipelt, unipelt-prompt, peft-lora, peft-prompt]
  --prompt-init-vocab INT       initialize the prompt from the word embeddings of tokens drawn from
                                the N most frequent of the model's vocabulary (Lester et al. 2021
                                sampled 5000; 0: off) (default: 0) [lora, prefix, adapter, prompt,
                                unipelt, unipelt-prompt, peft-lora, peft-prompt]
  --prompt-combine STR          where the prompt goes: 'prefix' (before the input) or
                                'prefix_after_bos' (after [CLS]) (default: after [CLS] for prompt
                                and unipelt-prompt) [lora, prefix, adapter, prompt, unipelt,
                                unipelt-prompt, peft-lora, peft-prompt]
  --prompt-lr-scale FLOAT       the soft prompt's learning rate as a multiple of the run's (default:
                                10 for unipelt-prompt, 1 for prompt) [lora, prefix, adapter, prompt,
                                unipelt, unipelt-prompt, peft-lora, peft-prompt]
  --gates, --no-gates           gate each module (default: on for unipelt*, off for single methods)
                                [lora, prefix, adapter, prompt, unipelt, unipelt-prompt, peft-lora,
                                peft-prompt]
  --train-pooler, --no-train-pooler
                                train the base model's pooler (Linear + tanh on [CLS]) with the
                                classifier head (peft's methods keep it frozen) (default: False)
                                [lora, prefix, adapter, prompt, unipelt, unipelt-prompt, peft-lora,
                                peft-prompt]
  --from-layer INT              adapt only layers from this index on (the layer-wise variant)
                                (default: 0) [lora, prefix, adapter, prompt, unipelt, unipelt-
                                prompt, peft-lora, peft-prompt]
  --lax-crossing STR            LaX crossing G: one of identity, dense, kronecker, zero (default:
                                kronecker) [lax-tt]
  --comera-target-ratio FLOAT   CoMERA: late-stage target size S*/S, in (0, 1] (default: 0.5)
                                [comera, cola-adaptive]
  --comera-late-fraction FLOAT  CoMERA: share of steps in the late stage (default: 0.5) [comera,
                                cola-adaptive]
  --comera-gamma FLOAT          CoMERA: weight of the rank penalty (early stage) (default: 0.01)
                                [comera, cola-adaptive]
  --comera-target-loss FLOAT    CoMERA: late-stage loss target L* (default: mean task loss of the
                                last tenth of the early stage) [comera, cola-adaptive]
  --comera-freeze-at-target, --no-comera-freeze-at-target
                                CoMERA: freeze the rank gates once the late stage reaches S*
                                (default: True) [comera, cola-adaptive]
  --comera-truncate-every INT   CoMERA: also slice dead ranks out every this many steps (0: stage
                                ends only) (default: 0) [comera, cola-adaptive]
  --prune-at-end, --no-prune-at-end
                                kill the smallest gates at the end of the late stage until the size
                                target is met (not in CoMERA) (default: False) [comera]; kill the
                                smallest gates at the end of the late stage until the size target is
                                met (default: True) [cola-adaptive]
  --galore-update-proj-gap INT  GaLore: steps between projector SVDs (default: 200) [galore]
  --galore-scale FLOAT          GaLore: update scale alpha (default: 0.25) [galore]
  --n-cores INT                 TT cores per linear layer (half input, half output modes) (default:
                                4) [tt-qat]
  --tt-init STR                 one of ('tt_svd', 'random'): TT-SVD of the trained weights, or
                                random cores (release) (default: tt_svd) [tt-qat]
  --tt-embedding, --no-tt-embedding
                                also put the word embedding in TTM format (default: False) [tt-qat]
  --embedding-rank INT          TTM rank of the word embedding (default: 32) [tt-qat]
  --qat STR                     one of ('none', 'weight', 'weight+activation'): what is fake-
                                quantized (default: weight) [tt-qat]
  --bits INT                    core (and input) bits (default: 4) [tt-qat]
  --bits-intermediate INT       intermediate bits (weight+activation mode) (default: 8) [tt-qat]"""


_SECTIONS: dict[str, tuple[str, ...]] = {
    "": (
        """usage: tensorslim [-h] [--version]
                  {train,bench,convert,quantize,distill,generate,finetune,longeval,segment,predict,export,compress}
                  ...

Low-rank and tensor-network training and compression for transformers.

positional arguments:
  {train,bench,convert,quantize,distill,generate,finetune,longeval,segment,predict,export,compress}
    train                       train a registered model with a method on a task (default: tiny CoLA
                                on the stdlib corpus)
    bench                       measure params, FLOPs, step time and memory of methods vs dense
    convert                     show (or apply and save) a method's conversion of a registered model
                                or a Hugging Face folder
    quantize                    post-training quantization (COMQ, GPTQ, RTN) of a Hugging Face model
                                folder
    distill                     distill MiniLM into a TT + QAT student, layer by layer (an alias of
                                train --task distill --method tt-qat)
    generate                    continue a prompt with a training run's latest checkpoint (causal LM
                                runs)
    finetune                    fine-tune one adapter method (LoRA, prefix, adapter, prompt,
                                UniPELT, peft) of a pretrained classifier
    longeval                    perplexity / needle recall on long documents with a bounded
                                attention memory (--memory lra --capacity N)
    segment                     train and evaluate one U-Net segmentation setting: image, global
                                binary mask or both (arXiv 2205.09107)
    predict                     predict with a trained run: labels (classify, lookahead), filled
                                masks (mlm), continuations (lm), answers (longqa), embeddings
                                (distill), masks (segment)
    export                      write a run's model as a folder to ship (tensorslim format, and
                                Hugging Face format where it is plain)
    compress                    compress a pretrained model to a params/bytes/FLOPs budget, choosing
                                the family and size of every layer

options:
  -h, --help                    show this help message and exit
  --version                     show program's version number and exit""",
    ),
    "train": (
        """usage: tensorslim train [-h] [--preset STR] [--task STR] [--method STR] [--factor-vocab INT]
                        [--factor-embedding | --no-factor-embedding] [--steps INT]
                        [--batch-size INT] [--seq-len INT] [--grad-accum INT] [--lr FLOAT]
                        [--weight-decay FLOAT] [--optimizer-state STR] [--grad-clip FLOAT]
                        [--warmup-fraction FLOAT] [--min-lr-ratio FLOAT] [--dtype STR]
                        [--compile | --no-compile] [--keep-freed-memory | --no-keep-freed-memory]
                        [--seed INT] [--data STR] [--text-field STR] [--tokenizer STR]
                        [--vocab-size INT] [--eval-every INT] [--eval-blocks INT]
                        [--checkpoint-every INT] [--init STR] [--init-base STR] [--out-dir STR]
                        [--resume | --no-resume] [--overwrite | --no-overwrite] [--device STR]
                        [--cuda-graphs | --no-cuda-graphs] [--progress | --no-progress]
                        [--tensorboard | --no-tensorboard] [--tp INT] [--tp-style STR]
                        [--dp-shard INT] [--tp-overlap STR]
                        [method options] [task options]

train a registered model with a method on a task (default: tiny CoLA on the stdlib corpus)

methods:
  lora       LoRA on W_q, W_v of a frozen model (arXiv 2106.09685); --gates: UniPELT's gated LoRA
  prefix     prefix tuning through a 2-layer MLP (arXiv 2101.00190); --gates: UniPELT's gated prefix
  adapter    bottleneck adapter after each FFN (seq_bn, arXiv 2005.00247); --gates: UniPELT's gated adapter
  prompt     prompt tuning: soft tokens before the input (arXiv 2104.08691)
  unipelt    UniPELT: gated LoRA + prefix + adapter on a frozen model (arXiv 2110.07577)
  unipelt-prompt UniPELT + a prompt tuning layer (arXiv 2405.05493)
  peft-lora  Hugging Face peft's LoRA on query/value (reference)
  peft-prompt Hugging Face peft's prompt tuning (reference)
  cola       CoLA: every block projection becomes B·σ(A·x) (arXiv 2502.10940)
  svd        plain low-rank B·A projections (CoLA's SVD baseline)
  cola-m     CoLA-M: CoLA with only the rank-r latents checkpointed (arXiv 2502.10940 §4)
  lax-cola   LaX on CoLA: latent crossing between consecutive blocks (arXiv 2505.21732)
  lax-svd    LaX on SVD layers (arXiv 2505.21732)
  tt         plain TT layers: CoMERA's init and max rank, no rank gates or stages (arXiv 2405.14377)
  lax-tt     LaX on CoMERA's TT layers: crossing at the middle bond (arXiv 2505.21732)
  comera     CoMERA: TT layers with rank gates, trained in two rank-adaptive stages (arXiv 2405.14377)
  cola-adaptive rank-adaptive CoLA: CoMERA's rank gates and two stages on CoLA's latent (beyond arXiv 2502.10940)
  dense      the full-rank model with AdamW (the baseline)
  galore     full-rank model, GaLore-AdamW low-rank gradient projection (arXiv 2403.03507)
  kron       Kronecker-factored projections A ⊗ B (Van Loan & Pitsianis 1993)
  tt-qat     QAT-TT: encoder linears as TT cores (TT-SVD), LSQ-quantized to --bits (arXiv 2306.01076)

models:
  bert-tiny    BERT 96-d, 2 layers, vocab 1000, mean pooling (tests) [mlm, classify]
  bert-small   BERT 192-d, 2 layers, vocab 4097, mean pooling (CPU-sized) [mlm, classify]
  bert6        CoMERA's six-encoder BERT (arXiv 2405.14377): 768-d, 12 heads, vocab 30522 [mlm, classify]
  gpt2-tiny    GPT-2 128-d, 2 layers, vocab 4096 (CPU-sized, tests) [lm]
  gpt2-small   GPT-2 small (124M): 768-d, 12 layers, 12 heads, vocab 50257, context 1024 [lm]
  minilm       pretrained all-MiniLM-L6-v2 (Hugging Face BERT, 384-d, 6 layers; bundled, no MLM head) [classify, embed]
  tiny         LLaMA 256-d, 4 layers, vocab 4096 (CPU-sized, not in the papers) [lm]
  60m          LLaMA 60M (GaLore/CoLA): 512-d, 8 layers, 8 heads [lm]
  130m         LLaMA 130M (GaLore/CoLA): 768-d, 12 layers, 12 heads [lm]
  350m         LLaMA 350M (GaLore/CoLA): 1024-d, 24 layers, 16 heads [lm]
  1b           LLaMA 1B (GaLore/CoLA): 2048-d, 24 layers, 32 heads [lm]
  7b           LLaMA 7B (GaLore/CoLA): 4096-d, 32 layers, 32 heads, context 2048 [lm]
  unet         2-D U-Net, 4 levels of 16-128 channels (segmentation, arXiv 2205.09107) [segment]
  unet-small   2-D U-Net, 4 levels of 8-64 channels (CPU-sized segmentation) [segment]
  unet-deep    2-D U-Net, 5 levels of 8-128 channels (nnU-Net's depth at 96 x 96: pooled down to 6 x 6) [segment]
  unet-deep-in unet-deep with instance norm (as nnU-Net and MONAI's BasicUNet use) [segment]

tasks:
  mlm        Masked language modelling (BERT) on packed text
  classify   Sequence classification (built-in data: bbcnews, bbcnews-titles; 5 topics)
  distill    Layer-wise distillation from the model's own pretrained weights (QAT-TT, arXiv 2306.01076)
  lm         Causal language modelling on packed text (default data: the Python standard library's source)
  longctx    Causal LM on stdlib code and BBC News with multi-key needles (for tensorslim longeval)
  lookahead  Look-ahead classification: [CLS]'s label is a cue word up to --max-distance tokens after it
  readlm     Causal LM pre-training that reads each document with a reader (--reader, random access: skips)
  longqa     QA over long synthetic documents (facts in BBC text), read window by window with a reader (--reader)
  segment    Binary segmentation from image / global binary mask (built-in data: brain, heart; arXiv 2205.09107)

options:
  -h, --help                    show this help message and exit
  --preset STR                  registered model (listed above) (default: tiny)
  --task STR                    a task listed above (default: the model's first task)
  --method STR                  training method (listed above) (default: cola)
  --factor-vocab INT            rank of a factored LM head (LLaMA; beyond the papers), 0 keeps it
                                dense (default: 0)
  --factor-embedding, --no-factor-embedding
                                also factor the token embedding at --factor-vocab's rank (fewer
                                parameters, no faster step) (default: False)
  --steps INT                   optimizer steps (default: 300)
  --batch-size INT              sequences per micro-batch (default: 16)
  --seq-len INT                 tokens per sequence (default: 128)
  --grad-accum INT              micro-batches per optimizer step (default: 1)
  --lr FLOAT                    peak learning rate (default: the method's recipe)
  --weight-decay FLOAT          AdamW weight decay (default: 0.01)
  --optimizer-state STR         dtype of AdamW's moments: fp32, or bf16 (half the optimizer memory,
                                slower on CPU; beyond the papers) (default: fp32)
  --grad-clip FLOAT             max gradient norm, 0 disables clipping (default: 0.5)
  --warmup-fraction FLOAT       warm-up share of steps (default: recipe)
  --min-lr-ratio FLOAT          cosine floor as a fraction of the peak lr (default: 0.1)
  --dtype STR                   fp32, bf16 autocast (slow on CPUs without AVX-512 BF16), or auto:
                                bf16 where the hardware has it (default: fp32)
  --compile, --no-compile       torch.compile the model (compile time reported apart) (default:
                                False)
  --keep-freed-memory, --no-keep-freed-memory
                                CPU: keep freed memory in the process (no page faults each step;
                                holds the peak until exit) (default: True)
  --seed INT                    seed of model init and data order (default: 0)
  --data STR                    stdlib, bbcnews, a .txt/.jsonl file or folder, a datasets
                                save_to_disk folder, or parquet (default: stdlib)
  --text-field STR              text column of a datasets/parquet table, or field of a .jsonl
                                (default: text)
  --tokenizer STR               local Hugging Face tokenizer path (default: BPE)
  --vocab-size INT              BPE vocabulary size (default: the model's)
  --eval-every INT              steps between validation passes (default: 100)
  --eval-blocks INT             size of the fixed held-out set, in sequences (default: 64)
  --checkpoint-every INT        steps between checkpoints (default: 100)
  --init STR                    start from a folder of the same model written by save_pretrained /
                                `tensorslim convert --save` (default: none)
  --init-base STR               start the model from another run of the same preset before the
                                method converts it (e.g. an MLM run's encoder under adapters): its
                                run folder or checkpoint; every weight it has under the same name is
                                loaded, a new head keeps its init (default: none)
  --out-dir STR                 run folder (default: runs/<preset>-<method>)
  --resume, --no-resume         continue from the run folder's latest checkpoint (default: False)
  --overwrite, --no-overwrite   replace the run in a non-empty out_dir (its checkpoints, metrics,
                                summary and model) (default: False)
  --device STR                  cpu or cuda (default: cpu)
  --cuda-graphs, --no-cuda-graphs
                                capture each step in a CUDA graph (device cuda, one process,
                                grad_accum 1, no method hook) (default: False)
  --progress, --no-progress     show a progress bar (default: True)
  --tensorboard, --no-tensorboard
                                also log to TensorBoard when it is installed (default: True)
  --tp INT                      tensor-parallel size; the rest of the world is data parallel
                                (default: 1)
  --tp-style STR                btp (BOOST), vanilla (low-rank TP) or megatron (dense) (default:
                                btp)
  --dp-shard INT                FSDP2 over the data-parallel axis: its size (world / tp); 1 keeps
                                DDP (default: 1)
  --tp-overlap STR              btp: overlap latent all-reduces with computation: none, backward or
                                full (docs/scale_out.md) (default: none)""",
        METHOD_OPTIONS,
        """task options (each applies to the tasks named):
  --train-size INT              training examples drawn per seed (0: the whole training split)
                                (default: 0) [classify]
  --dev-size INT                development examples drawn per seed from the training split (0:
                                none, validate on test) (default: 0) [classify]
  --steps-per-layer INT         steps before one more encoder layer joins the loss (release: 2000)
                                (default: 20) [distill]
  --needles FLOAT               share of training blocks that are needle documents, in [0, 1] (at
                                most 4,000) (default: 0.5) [longctx]
  --needle-keys INT             facts per training needle document (fewer if the block is short)
                                (default: 8) [longctx]
  --mentions INT                times each fact is stated in a training needle document (>= 2: the
                                later are recalls) (default: 3) [longctx]
  --repeats FLOAT               share of needle documents replaced by a BBC passage read twice, in
                                [0, 1) (default: 0.0) [longctx]
  --fact-share FLOAT            largest share of a training needle document taken by facts, in (0,
                                1) (the rest is BBC filler) (default: 0.375) [longctx]
  --key-weight FLOAT            loss weight of the token after a needle key (a fact's value), >= 1
                                (1: plain language modelling) (default: 1.0) [longctx]
  --max-distance INT            the cue lies 1..max_distance tokens after [CLS] (default: 32)
                                [lookahead]
  --examples INT                training documents (validation: --eval-blocks documents) (default:
                                2000) [lookahead]
  --reader STR                  how the reading tasks walk a document: sequential, random-access,
                                random-skip (default: random-access) [readlm, longqa]
  --skip-k INT                  random access: skip granularity K in tokens (skips are multiples of
                                K) (default: 16) [readlm, longqa]
  --skip-alpha FLOAT            random access: a window of pooled loss C skips K*floor(alpha/C)
                                tokens (default: 2.0) [readlm]; random access: a window of pooled
                                loss C skips K*floor(alpha/C) tokens (default: 4.0) [longqa]
  --pooling STR                 random access: pooling of the window's token losses: mean, last
                                (default: mean) [readlm, longqa]
  --skip-lengths STR            random-skip: comma-separated skip lengths (tokens) to draw from
                                (default: ) [readlm, longqa]
  --qa-docs INT                 longqa: training documents (validation: --eval-blocks documents)
                                (default: 800) [longqa]
  --dev-docs INT                longqa: development documents, from other held-out articles (for
                                choosing alpha) (default: 0) [longqa]
  --doc-tokens INT              longqa: tokens per document (default: 2048) [longqa]
  --passage-tokens INT          longqa: tokens per BBC passage (two per document, one holds the
                                fact) (default: 256) [longqa]
  --fact-lead INT               longqa: a fact sits at least this many tokens into its passage
                                (default: 128) [longqa]
  --distractors INT             longqa: passages holding a fact about another name (0 or 1)
                                (default: 0) [longqa]
  --answer-weight FLOAT         longqa: weight of the answer's cross-entropy next to the window's LM
                                loss (default: 1.0) [longqa]
  --dataset STR                 segmentation data: brain (warped MNI152, ventricles) or heart
                                (thorax phantoms) (default: heart) [segment]
  --inputs STR                  U-Net input: mask, image, image+mask, prior or image+prior (default:
                                mask) [segment]
  --train-cases INT             training cases drawn from the pool (brain 26, heart 12, or --train-
                                pool) (default: 8) [segment]
  --train-pool INT              training pool size; 0: the paper's (brain 26, heart 12); the data
                                are synthetic (default: 0) [segment]
  --image-size INT              image side in pixels (a multiple of the U-Net's 2 ** (levels - 1))
                                (default: 96) [segment]
  --augment, --no-augment       random small affine moves of input and target together (default:
                                True) [segment]
  --intensity STR               image-channel intensity augmentation: none, nnunet or strong
                                (default: nnunet) [segment]
  --mask-dropout FLOAT          probability of blanking the mask channel of an image+mask training
                                sample (default: 0.0) [segment]""",
    ),
    "bench": (
        """usage: tensorslim bench [-h] [--preset STR] [--task STR] [--methods STR] [--batch-size INT]
                        [--seq-len INT] [--warmup INT] [--repeats INT] [--rank INT] [--seed INT]
                        [--device STR] [--threads INT] [--timer STR] [--dtype STR]
                        [--compile | --no-compile] [--keep-freed-memory | --no-keep-freed-memory]
                        [--out STR] [--overwrite | --no-overwrite]

measure params, FLOPs, step time and memory of methods vs dense

options:
  -h, --help                    show this help message and exit
  --preset STR                  registered model (see `tensorslim train -h`) (default: 60m)
  --task STR                    lm, mlm or classify (default: the model's first task)
  --methods STR                 comma-separated methods; dense is always added (default: dense,cola)
  --batch-size INT              sequences per step (default: 4)
  --seq-len INT                 tokens per sequence (default: 256)
  --warmup INT                  untimed steps per method (default: 2)
  --repeats INT                 timed steps per method, alternating between methods (default: 5)
  --rank INT                    rank of every method that has one (default: its own)
  --seed INT                    seed of model init and the random token batch (default: 0)
  --device STR                  cpu or cuda (default: cpu)
  --threads INT                 torch CPU threads (default: torch's choice)
  --timer STR                   wall; cpu: process CPU time, robust on a shared machine with
                                --threads 1; thread: the main thread's CPU time, which with
                                OMP_WAIT_POLICY=PASSIVE approximates a multi-thread step on a shared
                                machine (default: wall)
  --dtype STR                   precisions to measure, comma-separated: fp32, bf16, auto (probed)
                                (default: fp32)
  --compile, --no-compile       also measure each method torch.compiled, next to eager (default:
                                False)
  --keep-freed-memory, --no-keep-freed-memory
                                CPU: keep freed memory in the process, as training does (no page
                                faults each step) (default: True)
  --out STR                     output stem for .md/.json/.png (default: print only)
  --overwrite, --no-overwrite   replace the .md/.json/.png of --out when they exist (default: False)""",
    ),
    "convert": (
        """usage: tensorslim convert [-h] [--preset STR] [--model STR] [--method STR] [--save STR]
                          [--overwrite | --no-overwrite]
                          [method options]

show (or apply and save) a method's conversion of a registered model or a Hugging Face folder

methods that convert: lora, prefix, adapter, prompt, unipelt, unipelt-prompt, peft-lora, peft-prompt, cola, svd, cola-m, lax-cola, lax-svd, tt, lax-tt, comera, cola-adaptive, kron, tt-qat

options:
  -h, --help                    show this help message and exit
  --preset STR                  registered model to convert (ignored with --model) (default: 60m)
  --model STR                   local Hugging Face model folder instead of a preset (default: None)
  --method STR                  a method that converts layers (see `tensorslim train -h`) (default:
                                cola)
  --save STR                    write the converted model to this folder (see docs/save_load.md)
                                (default: None)
  --overwrite, --no-overwrite   write into a --save folder that holds files, replacing the files it
                                writes (default: False)""",
        METHOD_OPTIONS,
    ),
    "quantize": (
        """usage: tensorslim quantize [-h] [--model STR] [--method STR] [--bits INT] [--granularity STR]
                           [--init STR] [--order STR] [--sweeps INT]
                           [--update-scale | --no-update-scale] [--act-order | --no-act-order]
                           [--embeddings | --no-embeddings] [--data STR] [--calib-docs INT]
                           [--seq-len INT] [--out STR] [--overwrite | --no-overwrite]

post-training quantization (COMQ, GPTQ, RTN) of a Hugging Face model folder

options:
  -h, --help                    show this help message and exit
  --model STR                   'minilm' (the bundled MiniLM BERT) or a HF model folder (default:
                                minilm)
  --method STR                  one of ('comq', 'gptq', 'rtn') (default: comq)
  --bits INT                    code width, 2..8 (default: 4)
  --granularity STR             'channel' or 'layer' (default: channel)
  --init STR                    COMQ start: 'gptq', 'rtn' or 'float' (the release) (default: gptq)
  --order STR                   COMQ coordinate order: 'cyclic' or 'greedy' (paper) (default:
                                cyclic)
  --sweeps INT                  COMQ sweeps (default: 1)
  --update-scale, --no-update-scale
                                COMQ least-squares scale update (default: True)
  --act-order, --no-act-order   GPTQ: columns by decreasing diag(H) (default: False)
  --embeddings, --no-embeddings
                                also quantize the token embeddings (RTN, one grid per token) and the
                                output head, as llama.cpp does (default: False)
  --data STR                    calibration corpus: 'bbcnews', 'stdlib' or a path (default: bbcnews)
  --calib-docs INT              calibration documents (first seq-len tokens of each) (default: 128)
  --seq-len INT                 tokens per calibration document (default: 128)
  --out STR                     write the quantized model to this .safetensors file (default: None)
  --overwrite, --no-overwrite   replace the --out file when it exists (default: False)""",
    ),
    "distill": (
        """usage: tensorslim distill [-h] [--rank INT] [--n-cores INT] [--init STR]
                          [--tt-embedding | --no-tt-embedding] [--embedding-rank INT] [--qat STR]
                          [--bits INT] [--bits-intermediate INT] [--steps-per-layer INT]
                          [--task-steps INT] [--lr FLOAT] [--final-lr FLOAT] [--batch-size INT]
                          [--seq-len INT] [--eval-docs INT] [--eval-bbc | --no-eval-bbc]
                          [--head-docs INT] [--test-docs INT] [--seed INT] [--out-dir STR]
                          [--resume | --no-resume] [--overwrite | --no-overwrite] [--out STR]

distill MiniLM into a TT + QAT student, layer by layer (an alias of train --task distill --method tt-qat)

options:
  -h, --help                    show this help message and exit
  --rank INT                    max TT rank of the encoder's linear layers (default: 16)
  --n-cores INT                 TT cores per linear layer (half input, half output modes) (default:
                                4)
  --init STR                    one of ('tt_svd', 'random'): TT-SVD of the trained weights, or
                                random cores (release) (default: tt_svd)
  --tt-embedding, --no-tt-embedding
                                also put the word embedding in TTM format (default: False)
  --embedding-rank INT          TTM rank of the word embedding (default: 32)
  --qat STR                     one of ('none', 'weight', 'weight+activation'): what is fake-
                                quantized (default: weight)
  --bits INT                    core (and input) bits (default: 4)
  --bits-intermediate INT       intermediate bits (weight+activation mode) (default: 8)
  --steps-per-layer INT         steps before one more encoder layer joins the loss (release: 2000)
                                (default: 20)
  --task-steps INT              final-phase steps (every layer + the embedding loss) (default: 40)
  --lr FLOAT                    peak learning rate (release: 1e-3) (default: 0.001)
  --final-lr FLOAT              learning rate at the end (release's task phase: 2e-5) (default:
                                2e-05)
  --batch-size INT              sequences per step (default: 8)
  --seq-len INT                 tokens per sequence (default: 64)
  --eval-docs INT               held-out BBC articles for cosine/Spearman (default: 64)
  --eval-bbc, --no-eval-bbc     BBC topic accuracy with a head fit on teacher features (default:
                                True)
  --head-docs INT               BBC training articles used to fit the head (default: 400)
  --test-docs INT               BBC test articles the accuracy is read on, spread over the classes
                                (default: all 444)
  --seed INT                    seed of student init and data order (default: 0)
  --out-dir STR                 run folder (default: runs/minilm-distill-tt-qat)
  --resume, --no-resume         continue from the run folder's latest checkpoint (default: False)
  --overwrite, --no-overwrite   replace the run in a non-empty out_dir, and an existing --out report
                                (default: False)
  --out STR                     write the JSON report here (default: None)""",
    ),
    "generate": (
        """usage: tensorslim generate [-h] --run DIR [--prompt STR] [--max-new-tokens INT]
                           [--temperature FLOAT] [--top-k INT] [--top-p FLOAT]
                           [--greedy | --no-greedy] [--seed INT] [--device STR]

continue a prompt with a training run's latest checkpoint (causal LM runs)

options:
  -h, --help             show this help message and exit
  --run DIR              training run folder
  --prompt STR           text to continue (default: )
  --max-new-tokens INT   tokens to generate at most (default: 64)
  --temperature FLOAT    divides the logits before sampling (default: 1.0)
  --top-k INT            sample among the k most likely tokens (default: None)
  --top-p FLOAT          sample within the top-p probability nucleus (default: None)
  --greedy, --no-greedy  take the most likely token at each step (default: False)
  --seed INT             sampling seed (default: 0)
  --device STR           cpu or cuda (default: cpu)""",
    ),
    "finetune": (
        """usage: tensorslim finetune [-h] [--model MODEL] [--method METHOD] [--data DATA]
                           [--train-size TRAIN_SIZE] [--dev-size DEV_SIZE] [--steps STEPS] [--lr LR]
                           [--batch-size BATCH_SIZE] [--seq-len SEQ_LEN] [--seed SEED]
                           [--out-dir OUT_DIR] [--overwrite]

fine-tune one adapter method (LoRA, prefix, adapter, prompt, UniPELT, peft) of a pretrained classifier

options:
  -h, --help               show this help message and exit
  --model MODEL            registered pretrained classifier model (default: minilm)
  --method METHOD          adapter method, or 'dense' for full fine-tuning (default: lora)
  --data DATA              classification data set (default: bbcnews-titles)
  --train-size TRAIN_SIZE  training examples K (0: all; default: 100)
  --dev-size DEV_SIZE      development examples drawn from the training split
  --steps STEPS            optimizer steps (default: 32, 5 passes over K = 100)
  --lr LR                  peak learning rate (default: the method's)
  --batch-size BATCH_SIZE
  --seq-len SEQ_LEN        tokens per example ([CLS] included)
  --seed SEED              seed of the K examples, the init and the data order
  --out-dir OUT_DIR        run folder (default: runs/<model>-<method>)
  --overwrite              replace the run's own outputs in a used folder""",
    ),
    "longeval": (
        """usage: tensorslim longeval [-h] [--run DIR | --preset PRESET] [--data DATA] [--length LENGTH]
                           [--docs DOCS] [--compare] [--json PATH] [--overwrite] [--capacity INT]
                           [--policy STR] [--sinks INT] [--chunk INT] [--wait INT] [--tau FLOAT]
                           [--recent INT] [--lra-insert | --no-lra-insert] [--memory POLICY]

perplexity / needle recall on long documents with a bounded attention memory (--memory lra --capacity N)

options:
  -h, --help                    show this help message and exit
  --run DIR                     a tensorslim train --task longctx run folder
  --preset PRESET               a freshly initialised LLaMA preset instead of a run (smoke test)
  --data DATA                   documents, one of ['stdlib', 'needles', 'needles-recalled', 'bbc-
                                business', 'bbc-entertainment', 'bbc-politics', 'bbc-sport', 'bbc-
                                tech'] (default: stdlib)
  --length LENGTH               tokens per document (default: 512)
  --docs DOCS                   documents read (default: 8)
  --compare                     also run every baseline at the same capacity
  --json PATH                   also write the rows as JSON
  --overwrite                   replace the --json file when it exists

memory (tensorslim.layers.memory.MemoryConfig):
  --capacity INT                entries per layer and key/value head kept between chunks (the memory
                                budget) (default: 256)
  --policy STR                  eviction policy, one of ['fifo', 'lra', 'lfa', 'h2o'] (default: lra)
  --sinks INT                   first tokens of the stream never evicted (StreamingLLM's attention
                                sinks) (default: 0)
  --chunk INT                   tokens read per step; at most capacity + chunk entries are attended
                                at once (default: 64)
  --wait INT                    later tokens each query waits for before it attends (Attendre's Q
                                memory; encoders) (default: 0)
  --tau FLOAT                   attention probability at which an entry counts as attended (lra,
                                lfa) (default: 0.01)
  --recent INT                  newest entries never evicted (H2O's recent window; 0: half the
                                capacity for h2o) (default: 0)
  --lra-insert, --no-lra-insert
                                lra: a new entry counts as attended when inserted (else only once
                                attended) (default: True)
  --memory POLICY               same as --policy""",
    ),
    "segment": (
        """usage: tensorslim segment [-h] [--dataset DATASET] [--inputs INPUTS] [--train-cases TRAIN_CASES]
                          [--train-pool TRAIN_POOL] [--preset PRESET] [--image-size IMAGE_SIZE]
                          [--steps STEPS] [--batch-size BATCH_SIZE] [--lr LR]
                          [--augment | --no-augment] [--intensity INTENSITY]
                          [--mask-dropout MASK_DROPOUT] [--seed SEED] [--out-dir OUT_DIR]
                          [--overwrite] [--device DEVICE]

train and evaluate one U-Net segmentation setting: image, global binary mask or both (arXiv 2205.09107)

options:
  -h, --help                   show this help message and exit
  --dataset DATASET            brain (warped MNI152, ventricles) or heart (phantoms)
  --inputs INPUTS              mask, image, image+mask, prior or image+prior
  --train-cases TRAIN_CASES    training cases drawn from the pool (default: 4)
  --train-pool TRAIN_POOL      training pool size; 0: the paper's (brain 26, heart 12)
  --preset PRESET              U-Net preset: unet-small (8-64 ch), unet (16-128), unet-deep (8-128)
  --image-size IMAGE_SIZE      image side in pixels
  --steps STEPS                optimizer steps
  --batch-size BATCH_SIZE      images per step
  --lr LR                      peak learning rate (AdamW, warm-up then cosine)
  --augment, --no-augment      random affine moves
  --intensity INTENSITY        image-channel intensity augmentation: none, nnunet (default), strong
  --mask-dropout MASK_DROPOUT  probability of blanking the mask channel of a training sample
  --seed SEED                  seed of the training cases, the init and the data order
  --out-dir OUT_DIR            run folder (default: runs/segment-<dataset>-<inputs>)
  --overwrite                  replace the run's own outputs in a used folder
  --device DEVICE              cpu or cuda""",
    ),
    "predict": (
        """usage: tensorslim predict [-h] --run DIR [--file FILE] [--question QUESTION] [--out OUT]
                          [--overwrite] [--max-new-tokens MAX_NEW_TOKENS] [--greedy]
                          [--temperature TEMPERATURE] [--seed SEED] [--device DEVICE]
                          [inputs ...]

predict with a trained run: labels (classify, lookahead), filled masks (mlm), continuations (lm), answers (longqa), embeddings (distill), masks (segment)

positional arguments:
  inputs                        texts, a prompt (lm), documents (longqa) or image files (segment)

options:
  -h, --help                    show this help message and exit
  --run DIR                     run folder, model/ or checkpoint
  --file FILE                   read the texts from this file, one per line ('-': stdin)
  --question QUESTION           longqa: the question asked about each document
  --out OUT                     segment: a new or empty folder for the mask and overlay PNGs
                                (default: predictions)
  --overwrite                   segment: write into an --out folder that holds files
  --max-new-tokens MAX_NEW_TOKENS
                                lm: tokens to generate at most (default: 64)
  --greedy                      lm: take the most likely token at each step
  --temperature TEMPERATURE     lm: divides the logits (default: 1.0)
  --seed SEED                   lm: sampling seed (default: 0)
  --device DEVICE               cpu or cuda (default: cpu)""",
    ),
    "export": (
        """usage: tensorslim export [-h] --run DIR --out OUT [--merge-lora] [--format {tensorslim,gguf}]
                         [--gguf-type {f16,q8_0,q4_0,f32}]

write a run's model as a folder to ship (tensorslim format, and Hugging Face format where it is plain)

options:
  -h, --help                    show this help message and exit
  --run DIR                     run folder, model/ or checkpoint
  --out OUT                     the folder to write (must not exist or be empty)
  --merge-lora                  fold LoRA updates into their weights (exact)
  --format {tensorslim,gguf}    tensorslim folder, or GGUF (llama.cpp)
  --gguf-type {f16,q8_0,q4_0,f32}
                                weight type of --format gguf""",
    ),
    "compress": (
        """usage: tensorslim compress [-h] [--model STR] [--out STR] [--overwrite | --no-overwrite]
                           [--params FLOAT] [--bytes FLOAT] [--flops FLOAT] [--families STR]
                           [--data STR] [--calibration INT] [--held-out INT] [--seq-len INT]
                           [--heal | --no-heal] [--heal-texts INT] [--block-steps INT]
                           [--block-lr FLOAT] [--heal-steps INT] [--lr FLOAT] [--batch-size INT]

compress a pretrained model to a params/bytes/FLOPs budget, choosing the family and size of every layer

options:
  -h, --help                   show this help message and exit
  --model STR                  a Hugging Face model folder, a run folder (or its model/), or a
                               registered pretrained model (default: minilm)
  --out STR                    the folder to write (must be new or empty, unless --overwrite)
                               (default: None)
  --overwrite, --no-overwrite  write into a non-empty --out folder, replacing the files it writes
                               (default: False)
  --params FLOAT               budget: a fraction of the linear layers' parameters (or a count)
                               (default: None)
  --bytes FLOAT                budget: a fraction of the linear layers' bytes (or a count) (default:
                               None)
  --flops FLOAT                budget: a fraction of the linear layers' FLOPs per token (or a count)
                               (default: None)
  --families STR               comma-separated families to choose from (also: tt) (default:
                               lowrank,kron,int8,int4)
  --data STR                   corpus: calibration and healing from its training split, held-out
                               from its validation split (default: bbcnews)
  --calibration INT            calibration texts (causal LM: blocks of --seq-len tokens); fewer fit
                               the calibration text, not the model (default: 128)
  --held-out INT               held-out texts that each stage is scored on (default: 16)
  --seq-len INT                tokens per text (default: 128)
  --heal, --no-heal            heal by distillation from the original model: layer by layer (then
                               end to end with --heal-steps) (default: False)
  --heal-texts INT             healing texts, drawn from the training split (a corpus may hold
                               fewer) (default: 4800)
  --block-steps INT            healing layer by layer: steps per changed block (default 600; 0:
                               none; given, it turns on --heal)
  --block-lr FLOAT             peak learning rate of the layer-by-layer healing (default 1e-3)
  --heal-steps INT             healing end to end: distillation steps from the original model
                               (default 0: none)
  --lr FLOAT                   peak learning rate of the end-to-end healing (default 3e-5)
  --batch-size INT             texts per healing step (default 8)""",
    ),
}

TEXTS: dict[str, str] = {command: "\n\n".join(parts) + "\n" for command, parts in _SECTIONS.items()}
