"""The job of each role, free of ray: rollout (a worker), learning (the learner), evaluation
(the evaluator), experience (the replay server). Single mode runs them in-process; the Ray
actors in `distrl.runtime` wrap the same objects."""
