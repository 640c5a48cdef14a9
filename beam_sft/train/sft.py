"""The training job of `beam-sft train` and `scripts/train.py`: TRL's `sft.py` main with Beam's steps."""

from __future__ import annotations

DESCRIPTION = "Fine-tune on Beam Harmony data with TRL's SFTTrainer, loss on assistant turns only."


def main(script_args, training_args, model_args, callbacks=None):
    """Prepare data, train, save model + tokenizer (both templates), push. Returns the trainer; with
    `--dry_run`, prints the plan (`beam_sft/train/dry_run.py`) and returns None, training nothing."""
    if script_args.dry_run:
        import os

        from beam_sft.train.dry_run import dry_run

        print(dry_run(script_args, training_args, model_args, world_size=int(os.environ.get("WORLD_SIZE", "1"))))
        return None
    from beam_sft.dataset.arguments import data_settings
    from beam_sft.dataset.settings import PhaseOptions
    from beam_sft.eval.run import evaluate_trainer
    from beam_sft.model.load import check_tokenizer, load_model_and_tokenizer, save_embedded_base
    from beam_sft.train import run
    from beam_sft.train.data_phase import eval_inputs, training_datasets, training_inputs
    from beam_sft.train.eval_callback import add_beam_eval, beam_eval_wanted, held_out_records
    from beam_sft.train.new_tokens import refuse_tied_output_before_loading
    from beam_sft.train.source_eval import add_source_eval

    run.setup_logging(training_args)
    run.check_arguments(script_args, training_args)
    refuse_tied_output_before_loading(script_args, training_args, model_args)  # from the config: no weights
    if run.already_finished(training_args):  # a requeued job that had finished: nothing to do
        return None

    model, tokenizer, embedded = load_model_and_tokenizer(script_args, training_args, model_args)
    check_tokenizer(tokenizer, conformance=script_args.check_template and not embedded,
                    assistant_only_loss=training_args.assistant_only_loss)
    if embedded and model_args.use_peft:  # an adapter needs a base that can be loaded back: saved beside it
        with run.progress_bars_off():
            save_embedded_base(model, tokenizer, training_args.output_dir,
                               write=training_args.process_index == 0)

    settings = data_settings(script_args, training_args)
    train_dataset, eval_dataset, data_stats = training_datasets(
        training_inputs(script_args, seed=training_args.seed), tokenizer, settings,
        PhaseOptions(num_proc=training_args.dataset_num_proc, output_dir=training_args.output_dir,
                     main_process=training_args.process_index == 0, streaming=script_args.streaming,
                     world_size=training_args.world_size, shuffle_buffer=script_args.shuffle_buffer),
        eval_dataset_name=eval_inputs(script_args), cache_dir=script_args.prepared_cache_dir,
    )
    # The labels are already built from the template's masks, so TRL must take the dataset as tokenized;
    # its own assistant_only_loss path expects raw conversations.
    training_args.assistant_only_loss = False

    with run.progress_bars_off():  # no bars of TRL's passes over the data or of "Writing model shards"
        trainer = run.build_trainer(model, tokenizer, train_dataset, eval_dataset, script_args, training_args,
                                    model_args, callbacks)
        add_source_eval(trainer, script_args, eval_dataset, data_stats)  # eval_<source>_loss beside eval_loss
        # Beam metrics: held-out records read once (an empty split is warned about now, not after training)
        wanted = beam_eval_wanted(script_args, training_args)
        records = held_out_records(trainer, script_args, settings) if wanted else []
        add_beam_eval(trainer, tokenizer, script_args, training_args, records)  # in training; early stopping
        run.train(trainer, run.resume_checkpoint(training_args))  # faults: beam_sft/train/faults.py
        run.save(trainer, tokenizer, training_args.output_dir)
        if script_args.eval_beam:  # generate and score the eval split's records as `beam-sft eval` does
            evaluate_trainer(trainer, tokenizer, records)
    run.push(trainer, training_args)
    run.finish(trainer)
    return trainer


def make_parser(prog: str | None = None):
    """The options: `beam_sft/train/options.py` (TRL's parser, config errors as one line)."""
    from beam_sft.train.faults import isolate_restart_store
    from beam_sft.train.options import make_parser as options_parser

    # Parsing the options creates the process group: a restarted worker (--max_restarts) must get its own
    # store keys before that, every entry point parses through here.
    isolate_restart_store()

    return options_parser(prog=prog, description=DESCRIPTION)
