/* optim_impl.h - private: the optimizer object shared by the optim/ sources. An optimizer
 * is a kind (the algorithm: its name, hyperparameters, state slots and update function),
 * the groups' resolved hyperparameters, and per parameter its retained tensor, name, group,
 * update count and state tensors. Not installed. */
#ifndef NABLA_OPTIM_IMPL_H
#define NABLA_OPTIM_IMPL_H

#include "nabla/optim.h"
#include "tensor/backend.h"
#include "tensor/handle.h"
#include "tensor/tensor_impl.h"

#define NB__OPT_SLOTS 3 /* most state tensors per parameter (Adam with amsgrad, RMSprop) */

/* Numeric hyperparameters, in a fixed order: their names in the state dict come from
 * nb__hyper_names and the kind's mask says which ones it has. */
enum {
    NB__H_LR,
    NB__H_WEIGHT_DECAY,
    NB__H_MOMENTUM,
    NB__H_DAMPENING,
    NB__H_BETA1,
    NB__H_BETA2,
    NB__H_EPS,
    NB__H_ALPHA,
    NB__H_LR_DECAY,
    NB__H_INIT_ACC,
    NB__H_COUNT
};
extern const char *const nb__hyper_names[NB__H_COUNT];

typedef struct nb__hyper {
    double v[NB__H_COUNT];
    bool nesterov, amsgrad, centered, maximize, decoupled;
} nb__hyper;

typedef struct nb__oparam {
    nb_tensor *t;      /* retained */
    char *name;        /* owned copy */
    int group;
    bool has_state;    /* updated at least once, or state loaded */
    int64_t step;      /* updates so far (kinds with a step count) */
    nb_tensor *slot[NB__OPT_SLOTS]; /* owned; NULL where unused or not yet allocated */
    /* Half-precision (f16/bf16) parameters: the owned f32 master copy the update runs on
     * (its state is f32 too); the parameter receives it rounded after each update. Made
     * from the parameter on its first update; NULL for f32/f64 parameters. */
    nb_tensor *master;
} nb__oparam;

/* The dtype an optimizer computes a parameter of dtype dt in (its state's and master's):
 * f32 for the half types (master weights, docs/architecture.md rule 7), dt otherwise. */
static inline bool nb__opt_is_half(nb_dtype dt) { return dt == NB_F16 || dt == NB_BF16; }
static inline nb_dtype nb__opt_work_dtype(nb_dtype dt) {
    return nb__opt_is_half(dt) ? NB_F32 : dt;
}

typedef struct nb__optim_kind {
    const char *name;
    unsigned hypers;   /* bit NB__H_x set: the kind has that hyperparameter */
    bool has_step;
    /* The update of an element depends only on that element (and the hyperparameters), so
     * it gives the same result on any piece of a parameter: ZeRO can shard it. */
    bool elementwise;
    int nslots;
    const char *slot_names[NB__OPT_SLOTS];
    /* Whether the slot is in use under these hyperparameters. */
    bool (*slot_used)(const nb__hyper *h, int slot);
    /* Value a fresh slot starts with; NAN: the update initializes it (SGD's buffer). */
    double (*slot_init)(const nb__hyper *h, int slot);
    /* PyTorch's argument checks; `who` names the call in the message. */
    nb_status (*check)(const nb__hyper *h, const char *who);
    /* The kernel-table entry update launches (nb_step checks every parameter's device has
     * it before updating any, so a step is all or nothing). */
    const char *kernel;
    /* Update one parameter: fill the kernel's args with the device pointers of p->t, grad
     * (contiguous, same dtype, f32/f64, on p->t's device) and p's state, and launch the
     * kernel once on p->t's device (on meta it does not run). For a half parameter p->t is
     * its f32 master during the call. p->step is already incremented; fresh has bit k set
     * when slot k was allocated for this update. */
    nb_status (*update)(const nb__hyper *h, nb__oparam *p, const nb_tensor *grad,
                        unsigned fresh);
} nb__optim_kind;

struct nb_optim {
    nb__obj h; /* a checked handle (tensor/handle.h) */
    const nb__optim_kind *kind;
    nb__hyper defaults;        /* what the constructor resolved */
    nb__hyper *groups;
    int ngroups, cap_groups;
    nb__oparam *params;
    int nparams, cap_params;
    nb_params plist;           /* nb_optim_params: arrays owned, names borrowed from params */
    bool plist_ok;
    nb_params slist;           /* the last nb_optim_state: arrays and names owned */
    nb_tensor **sown;          /* scalar tensors of slist, owned */
    int nsown;
    struct nb__step_work *work; /* nb_step's per-parameter scratch, kept between steps */
    int work_cap;
    /* Set while a wrapper owns the update (nb_zero: the state lives in per-rank shards):
     * nb_step(opt) calls step_hook(step_ctx) instead of updating the parameters itself. */
    nb_status (*step_hook)(void *ctx);
    void *step_ctx;
    /* With step_hook: the optimizer whose parameters hold the gradients the hook steps on
     * (nb_zero's shard optimizer), for the loss scaler's unscale; NULL if none. */
    nb_optim *sharded;
};

/* The loss scaler (optim/scaler.c; nabla/optim.h). */
struct nb_grad_scaler {
    nb__obj h; /* a checked handle (tensor/handle.h) */
    nb_grad_scaler_opts o;
    double scale;
    int64_t tracker;           /* clean steps in a row since the last change of scale */
    int64_t steps, skipped;    /* update calls; skipped steps among them */
    bool unscaled;             /* unscale ran since the last update */
    bool stepped;              /* step ran since the last update */
    bool found_inf;            /* what the last unscale found (global with a comm) */
    bool last_skipped;
    nb_optim *opt;             /* the optimizer of this step (borrowed, during a step) */
    nb_optim *gopt;            /* the one holding its gradients: opt, or its shard optimizer */
    /* f32 unscaled gradients of half parameters, by the optimizer's parameter index (kept
     * between steps), and the gradients they replace until step or update puts them back. */
    nb_tensor **buf, **orig;
    int nbuf;
    nb_params slist;           /* nb_grad_scaler_state: arrays owned, names static */
    nb_tensor *sown[4];
    /* Set by nb_grad_scaler_set_comm (parallel/): combine the inf/NaN flag (0 or 1) of
     * every rank into *flag (the maximum). */
    nb_status (*reduce_flag)(double *flag, void *ctx);
    void *reduce_ctx;
};

extern const nb__optim_kind nb__kind_sgd, nb__kind_adam, nb__kind_adamw, nb__kind_rmsprop,
    nb__kind_adagrad;

/* Make an optimizer of kind with the first group's params (checks h with kind->check). */
nb_optim *nb__optim_new(const nb__optim_kind *kind, const nb__hyper *h, const nb_params *params);
/* Set a group's momentum (sgd, rmsprop) or beta1 (adam, adamw); for one-cycle schedules.
 * NB_EUNSUPPORTED for kinds without either. */
nb_status nb__optim_set_momentum(nb_optim *opt, int group, double m);
bool nb__optim_has_momentum(const nb_optim *opt);
/* Free the state list of nb_optim_state (optim/state.c), and that of nb_sched_state
 * (optim/schedule.c): nb_checkpoint_save drops them once written, so the scalars they own
 * go back to the allocator's cache for the training steps that follow. */
void nb__optim_state_clear(nb_optim *opt);
void nb__sched_state_clear(nb_sched *s);
/* Release one parameter's state tensors and forget its step count. */
void nb__oparam_reset(nb__oparam *p);

/* nb_clip_grad_norm over a shard of a larger gradient (ZeRO, parallel/zero.c): between
 * the local accumulation and the root, reduce(&total, max, ctx) replaces the partial sum of
 * |g|^p (max: the largest |g|) by that of all ranks; the norm and the scaling are then the
 * global ones. `who` names the call in messages. */
double nb__clip_grad_norm_global(const nb_params *ps, double max_norm, double norm_type,
                                 const char *who,
                                 nb_status (*reduce)(double *total, bool max, void *ctx),
                                 void *ctx);

/* Shared checks for the kinds' check functions. */
nb_status nb__check_nonneg(double v, const char *who, const char *what);

#endif
