// The schedule layer: pipeline schedules as data (torch-free).
#pragma once

#include "hp/schedule/action.h"
#include "hp/schedule/generators.h"
#include "hp/schedule/io.h"
#include "hp/schedule/lower.h"
#include "hp/schedule/render.h"
#include "hp/schedule/simulate.h"
#include "hp/schedule/validate.h"
