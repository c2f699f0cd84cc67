"""Run by tests/lightning/test_ddp.py in a subprocess: one DDP training step on CPU (gloo).

``python _ddp_worker.py OUT_DIR GUIDE`` with ``MASTER_PORT`` set; Lightning's launcher starts
rank 1 by re-running this command (which is why this is a script and not a pytest test).
Each rank writes ``OUT_DIR/rank{r}.pt``: its minibatch, its gradients after DDP's averaging
(first step, with the noise fixed), and one draw of the local-reparameterisation noise.
"""

import os
import sys
import warnings

import lightning as L
import torch

sys.path.insert(0, os.path.dirname(__file__))
from _problem import FixedNoise, make_problem  # noqa: E402

from pyro_dropout.lightning import BayesianModule  # noqa: E402


class Recorder(BayesianModule):
    def on_train_start(self):
        super().on_train_start()
        # One draw of the training noise on the same input on every rank (seeded in setup()).
        with torch.no_grad(), self._lrt():
            self.record["noise"] = self.model(self.x_probe)

    def training_step(self, batch, batch_idx):
        self.record["batch"] = batch
        with FixedNoise():  # the same "noise" in every rank and in the one-process reference
            return super().training_step(batch, batch_idx)

    def on_after_backward(self):  # DDP has averaged the gradients by now
        self.record["grads"] = {n: p.grad.clone() for n, p in self.named_parameters()}


def main(out, guide_name):
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    x, y, loader, model, guide = make_problem(guide_name)
    module = Recorder(model, guide, example=next(iter(loader)), lr=0.0, seed=123)
    module.record = {}
    module.x_probe = x[:4]
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_steps=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, loader)
    state = {k: v.detach().clone() for k, v in module.state_dict().items()}
    torch.save(
        {"state": state, **module.record}, os.path.join(out, f"rank{trainer.global_rank}.pt")
    )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
