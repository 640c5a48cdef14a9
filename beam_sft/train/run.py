"""The steps of the training job around TRL's trainer, one call each in `beam_sft.train.sft.main`."""

from __future__ import annotations

import contextlib
import json
import logging
from dataclasses import asdict
from pathlib import Path

from beam_sft.errors import BeamSFTError, FatalError, UsageError
from beam_sft.storage import write_json_atomic
from beam_sft.train import checkpoints, faults

logger = logging.getLogger(__name__)


def setup_logging(training_args) -> None:
    import datasets
    import transformers

    level = logging.INFO if training_args.process_index == 0 else logging.WARNING
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=level, force=True)
    logging.getLogger("beam_sft").setLevel(level)
    transformers.utils.logging.set_verbosity(logging.WARNING)
    datasets.utils.logging.set_verbosity(logging.WARNING)


@contextlib.contextmanager
def progress_bars_off():
    """No progress bars of datasets / transformers / huggingface_hub inside (restored after): TRL's passes
    over the prepared data (`Truncating`, `Dropping fully masked examples`), `Writing model shards`."""
    import datasets
    import huggingface_hub.utils as hub_utils
    from transformers.utils import logging as hf_logging

    was = (datasets.is_progress_bar_enabled(), hf_logging.is_progress_bar_enabled(),
           not hub_utils.are_progress_bars_disabled())
    datasets.disable_progress_bars()
    hf_logging.disable_progress_bar()
    hub_utils.disable_progress_bars()
    try:
        yield
    finally:
        for on, enable in zip(was, (datasets.enable_progress_bars, hf_logging.enable_progress_bar,
                                    hub_utils.enable_progress_bars), strict=True):
            if on:
                enable()


def check_arguments(script_args, training_args) -> None:
    """Refuse what cannot run, before loading anything."""
    import torch

    from beam_sft.train.eval_callback import beam_at_evaluate, beam_eval_wanted, beam_metric_named

    mixture = bool(getattr(script_args, "datasets", None))
    if script_args.dataset_name is None and not mixture:
        raise UsageError("--dataset_name is required (a file, a directory, or a hub dataset id), or a `datasets:` "
                         "list in the --config YAML")
    if mixture and (script_args.dataset_name or beam_eval_wanted(script_args, training_args)):
        raise UsageError("a `datasets:` mixture takes the place of dataset_name, and does not run eval_beam, "
                         "eval_beam_steps or eval_beam_on_evaluate yet")
    if training_args.use_liger_kernel:
        # Liger's kernels need a GPU and Liger is not a dependency: untested, so refused rather than trusted.
        raise UsageError("use_liger_kernel is not supported by beam-sft: its effect on assistant masks is untested")
    held_out = script_args.eval_dataset_name or script_args.dataset_test_split or script_args.eval_split_size > 0
    for name in ("eval_beam", "eval_beam_steps", "eval_beam_on_evaluate"):
        if getattr(script_args, name) and not held_out:
            # Refused now rather than noticed after the whole training run.
            raise UsageError(f"--{name} needs an eval split: set --eval_dataset_name or --eval_split_size")
    if script_args.eval_beam_steps is not None and script_args.eval_beam_steps < 1:
        raise UsageError(f"--eval_beam_steps must be a positive number of steps, not {script_args.eval_beam_steps}")
    if script_args.shuffle_buffer and not script_args.streaming:
        raise UsageError("--shuffle_buffer applies to --streaming (prepared data is shuffled by the trainer)")
    evaluates = training_args.eval_strategy != "no"
    if beam_at_evaluate(script_args, training_args) and not evaluates:
        name = ("eval_beam_on_evaluate" if script_args.eval_beam_on_evaluate
                else f"metric_for_best_model {training_args.metric_for_best_model}")
        raise UsageError(f"{name} needs evaluations: set eval_strategy (steps or epoch)")
    if beam_metric_named(training_args.metric_for_best_model) and not held_out:
        raise UsageError(f"metric_for_best_model {training_args.metric_for_best_model} needs an eval split: set "
                         "--eval_dataset_name or --eval_split_size")
    patience = script_args.early_stopping_patience
    if patience is not None and (patience < 1 or not evaluates or not training_args.metric_for_best_model):
        raise UsageError("early_stopping_patience must be a positive number of evaluations and needs "
                         "eval_strategy (steps or epoch) and metric_for_best_model")
    if script_args.streaming and training_args.max_steps <= 0:
        raise UsageError("--streaming needs --max_steps: a stream has no length to count epochs in")
    faults.parse_signals(training_args.preemption_signals)  # a misspelt signal refused now, not at the first step
    if training_args.nonfinite_max_skips < 0 or training_args.step_timeout < 0:
        raise UsageError("nonfinite_max_skips and step_timeout must be >= 0")
    if training_args.bf16 and not torch.cuda.is_available():
        logger.warning("bf16 requested without a GPU: training runs in bf16 autocast on CPU")


def resume_checkpoint(training_args):
    """`--resume_from_checkpoint last` (or true): the newest complete checkpoint of output_dir, or None; a path
    is taken as given unless it cannot be resumed. Says which checkpoint and step the run goes on from."""
    if (resume := training_args.resume_from_checkpoint) is None:
        return None
    if isinstance(resume, str) and resume.lower() in ("last", "true"):
        if (resume := checkpoints.last_complete(training_args.output_dir)) is None:
            why = (" (save_strategy is 'no': only a preemption writes a checkpoint)"
                   if getattr(training_args.save_strategy, "value", training_args.save_strategy) == "no" else "")
            logger.warning("no complete checkpoint in %s%s; starting from scratch", training_args.output_dir, why)
            return None
    else:
        lack = checkpoints.lacks(Path(resume)) if Path(resume).is_dir() else "no such directory"
        if lack is not None and not (Path(resume) / "trainer_state.json").is_file():
            raise UsageError(f"--resume_from_checkpoint {resume}: cannot resume, {lack}")
        if lack is not None:
            logger.warning("resuming from %s although it is not marked complete (%s)", resume, lack)
    logger.info("resuming from %s: %s", resume, _resume_plan(resume, training_args))
    return resume


def already_finished(training_args) -> bool:
    """`--resume_from_checkpoint last` on an output_dir whose run finished after its newest checkpoint (save_strategy
    no: only a preemption wrote one): resuming would train those steps again, so say so and train nothing."""
    resume = training_args.resume_from_checkpoint
    if not (isinstance(resume, str) and resume.lower() in ("last", "true")):
        return False
    newest = checkpoints.last_complete(training_args.output_dir, say=logger.debug)
    status = faults.read_status(training_args.output_dir, since=0)
    step = int(status.get("step") or 0) if status and status.get("status") == "finished" else None
    if step is None or step <= (checkpoints.step_of(Path(newest)) if newest else 0):
        return False
    logger.warning("%s holds a run that finished at step %d (run_status.json) after its newest checkpoint (%s): "
                   "resuming would train those steps again; nothing to do (use a new output_dir to train again)",
                   training_args.output_dir, step, Path(newest).name if newest else "none")
    return True


def _resume_plan(resume: str, training_args) -> str:
    try:
        state = json.loads((Path(resume) / "trainer_state.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "its trainer state is unreadable"
    step = int(state.get("global_step", 0))
    last = training_args.max_steps if training_args.max_steps > 0 else int(state.get("max_steps") or 0)
    if last and step >= last:
        return f"it is at step {step} of {last}: no step left to train"
    return f"step {step} done, training goes on at step {step + 1}" + (f" of {last}" if last else "")


def train(trainer, resume) -> None:
    """`trainer.train`; each way a run ends goes to run_status.json, as one line and its exit status."""
    args = trainer.args
    try:
        trainer.train(resume_from_checkpoint=resume)
    except BeamSFTError as err:
        if trainer.is_world_process_zero():
            faults.write_status(args.output_dir, type(err).__name__, err.exit_code, step=trainer.state.global_step,
                                message=str(err))
        elif isinstance(err, (faults.NonFiniteError, checkpoints.DiskFullError)):
            raise type(err)("") from None  # agreed on every rank: rank 0 says it, once
        raise
    except RuntimeError as err:
        if not (args.world_size > 1 and faults.is_peer_lost(err)):
            raise
        newest = checkpoints.last_complete(args.output_dir, say=logger.debug)
        who = faults.lost_ranks()
        if who == "another rank" and "timed out" in str(err).lower():
            who = f"another rank (alive but silent for step_timeout {args.step_timeout} s: hung)"
        raise FatalError(
            f"lost {who} at step {trainer.state.global_step + 1}: {str(err).splitlines()[0][:200]}; "
            f"{Path(newest).name if newest else 'no checkpoint'} is the newest complete checkpoint (rerun with "
            "--resume_from_checkpoint last, or launch with --max_restarts N to restart on its own)"
        ) from None
    if (stopped := trainer.preemption.stopped_at) is not None:
        checkpoint = str(Path(args.output_dir) / f"checkpoint-{stopped}")
        if trainer.is_world_process_zero():
            faults.write_status(args.output_dir, "preempted", faults.EXIT_PREEMPTED, step=stopped,
                                checkpoint=checkpoint)
        finish(trainer)
        # One line for the job, from rank 0: every rank exits 75.
        raise faults.Preempted(f"saved {checkpoint} (complete) at step {stopped} and stopped; rerun the same command "
                        "with --resume_from_checkpoint last to go on (exit status 75)"
                        if trainer.is_world_process_zero() else "")


def build_trainer(model, tokenizer, train_dataset, eval_dataset, script_args, training_args, model_args,
                  callbacks=None):
    """`BeamSFTTrainer` with LoRA (when asked), its loss path, exact packing and the fault callbacks."""
    from beam_sft.dataset.origins import row_origins
    from beam_sft.model.moe import build_peft_config, check_expert_adapters
    from beam_sft.train.fsdp import allow_fsdp_on_cpu, make_sharding_report
    from beam_sft.train.new_tokens import check_new_rows_trainable, make_new_rows_trainable
    from beam_sft.train.packing import ensure_exact_packing
    from beam_sft.train.trainer import make_trainer_class

    peft_config = build_peft_config(model_args, model, target_experts=script_args.lora_target_experts)
    new_rows = make_new_rows_trainable(peft_config, model)  # LoRA: beamify's marker rows train too
    plain_loss = training_args.loss_path == "plain" or (training_args.loss_path == "auto"
                                                        and training_args.device.type == "cpu")
    allow_fsdp_on_cpu()  # opt-in (BEAM_SFT_FSDP_ON_CPU=1): FSDP2 over CPU processes, see docs/fsdp.md
    trainer = make_trainer_class()(
        model=model, args=training_args, train_dataset=train_dataset, eval_dataset=eval_dataset,
        processing_class=tokenizer, peft_config=peft_config, callbacks=callbacks, plain_loss=plain_loss,
        guard=faults.NonFiniteGuard(training_args.on_nonfinite, training_args.nonfinite_max_skips))
    trainer.preemption = faults.make_preemption_callback(faults.parse_signals(training_args.preemption_signals))
    trainer.add_callback(trainer.preemption)
    trainer.add_callback(faults.make_step_timeout_callback(training_args.step_timeout))
    if trainer.is_fsdp_enabled:
        trainer.add_callback(make_sharding_report())
    if peft_config is not None:
        check_expert_adapters(trainer.model, wanted=script_args.lora_target_experts)
        if new_rows is not None:
            check_new_rows_trainable(trainer.model, new_rows["new_token_ids"])
    # After the trainer is built: the model is on its device and wrapped as it will train (LoRA B = 0, so the
    # adapters do not change the probe). Every rank probes and, if needed, hooks its own copy.
    packing = ensure_exact_packing(trainer.model, training_args, training_args.packing_check)
    if packing is not None and training_args.process_index == 0:
        write_json_atomic(Path(training_args.output_dir) / "packing_probe.json", asdict(packing))
    # A non-finite step names its records (`source:line`) from the prepared data's row origins. TRL's own passes
    # over a tokenized dataset keep its rows and order when they keep its length; packing does not (rows by number).
    trained = trainer.train_dataset
    if not training_args.packing and hasattr(trained, "__len__") and hasattr(train_dataset, "__len__"):
        origins = row_origins(train_dataset) if len(trained) == len(train_dataset) else None
        if origins is not None:
            trainer.guard.describe_rows = origins.describe
    return trainer


def save(trainer, tokenizer, output_dir: str) -> None:
    """The model, then the tokenizer with both templates (main process), and a one-line account."""
    from beam_sft.serve.servable import make_servable
    from beam_sft.template.tokenizer import save_tokenizer
    from beam_sft.train.fsdp import save_final_model

    save_final_model(trainer, output_dir)
    if trainer.accelerator.is_main_process:
        # Again, through save_tokenizer: it keeps the response template's key order (see its docstring).
        save_tokenizer(tokenizer, output_dir)
        make_servable(output_dir, tokenizer)  # eos list, serving-subset response template, file modes
        # Written with the model: a requeued job that finds it does nothing (already_finished).
        faults.write_status(output_dir, "finished", 0, step=trainer.state.global_step)
    trainer.accelerator.print(
        f"trained {trainer.state.global_step} steps; tokens seen {trainer._total_train_tokens}, supervised "
        f"{trainer._supervised_tokens} (this process's session); saved to {output_dir}"
    )


def push(trainer, training_args) -> None:
    """`push_to_hub`: upload the output directory once it is servable (model, tokenizer with both templates,
    the servable fixes). The trainer's own push runs inside its save, before any of those."""
    if not training_args.push_to_hub:
        return
    trainer.accelerator.wait_for_everyone()
    if not trainer.is_world_process_zero():
        return
    from transformers.utils.hub import hf_api

    trainer._finish_current_push()  # a checkpoint push (hub_strategy every_save) still running
    trainer.create_model_card(model_name=(training_args.hub_model_id or Path(training_args.output_dir).name)
                              .split("/")[-1])
    hf_api().upload_folder(
        repo_id=trainer.hub_model_id, folder_path=training_args.output_dir, commit_message="End of training",
        token=training_args.hub_token, revision=training_args.hub_revision,
        ignore_patterns=["_*", "checkpoint-*"],  # the trainer's own: no checkpoints, no temporary files
    )
    logger.info("pushed %s to the hub as %s", training_args.output_dir, trainer.hub_model_id)


def finish(trainer) -> None:
    # A rank that tears the process group down while another is still saving would leave that one blocked
    # in a collective forever.
    trainer.accelerator.wait_for_everyone()
    for tracker in trainer.accelerator.trackers:
        tracker.finish()
    # The DDP/FSDP wrapper holds the process group: dropped first, so the group goes down here, in order.
    trainer.model_wrapped = trainer.model
    trainer.accelerator._models.clear()
    faults.destroy_process_group()
