// hp/train.h: the public header of the train layer (config, tokenizer, corpus, data loader, metrics).
#pragma once

#include "hp/base/error.h"
#include "hp/train/config.h"
#include "hp/train/corpus.h"
#include "hp/train/data.h"
#include "hp/train/dry_run.h"
#include "hp/train/metrics.h"
#include "hp/train/tokenizer.h"
#include "hp/train/trainer.h"
